// emu_warp.h — warp-level operations for the SIMT emulator: shuffles, votes, __syncwarp, and the
// tensor-core instructions mma.sync.m16n8k16 and ldmatrix. All are warp collectives (emu_runtime.h):
// a lane deposits its operands, the last lane to arrive computes every lane's result exactly as the
// PTX ISA defines it (emu_warp.cpp), then all lanes continue. Full-warp masks only.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "emu_runtime.h"

namespace simt::emu {

// shfl.sync modes; operands b (lane / delta / xor mask) and c (segment mask << 8 | clamp) per PTX.
enum class ShflMode : uint32_t { Idx, Up, Down, Bfly };
struct ShflIn {
  uint64_t value;
  uint32_t b, c, mode;
};
void combine_shfl(LaneSlot* lanes, int nlanes);
[[noreturn]] void bad_shfl_width(int width, SrcLoc loc);

template <typename T>
T shfl(ShflMode mode, const char* what, unsigned mask, T v, int b, int width, SrcLoc loc) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move values of up to 8 bytes");
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) bad_shfl_width(width, loc);
  // c as CUDA's intrinsics encode it: bits 12:8 = 32 - width (segment mask), bits 4:0 = clamp lane
  // (0 for up, which compares against the segment's first lane; 31 for the others).
  ShflIn in{};
  std::memcpy(&in.value, &v, sizeof(T));
  in.b = static_cast<uint32_t>(b);
  in.c = static_cast<uint32_t>(32 - width) << 8 | (mode == ShflMode::Up ? 0u : 0x1fu);
  in.mode = static_cast<uint32_t>(mode);
  LaneSlot& slot = lane_slot();
  std::memcpy(slot.in, &in, sizeof in);
  warp_collective(what, mask, &combine_shfl, loc);
  T r;
  std::memcpy(&r, slot.out, sizeof(T));
  return r;
}

enum class Vote : uint32_t { Ballot, All, Any };
unsigned vote(Vote op, const char* what, unsigned mask, int pred, SrcLoc loc);
void sync_warp(unsigned mask, SrcLoc loc);

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16|f16}.{bf16|f16}.f32: d = a·b + c for the warp's 16×8 tile.
void mma_m16n8k16(bool bf16, float* d, const uint32_t* a, const uint32_t* b, const float* c, SrcLoc loc);
// ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16: `row_addr` is this lane's row address (lanes
// 8i..8i+7 address the rows of matrix i); r[i] receives this lane's two 16-bit elements of matrix i.
void ldmatrix(int num, bool trans, uint32_t* r, const void* row_addr, SrcLoc loc);

}  // namespace simt::emu

// ---- CUDA intrinsic names (a mask other than 0xffffffff is reported as a DEADLOCK) ------------------
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32,
              simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  return simt::emu::shfl(simt::emu::ShflMode::Idx, "__shfl_sync", mask, var, src_lane, width, loc);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                 simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  return simt::emu::shfl(simt::emu::ShflMode::Up, "__shfl_up_sync", mask, var, static_cast<int>(delta), width, loc);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                   simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  return simt::emu::shfl(simt::emu::ShflMode::Down, "__shfl_down_sync", mask, var, static_cast<int>(delta), width,
                         loc);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                  simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  return simt::emu::shfl(simt::emu::ShflMode::Bfly, "__shfl_xor_sync", mask, var, lane_mask, width, loc);
}
inline unsigned __ballot_sync(unsigned mask, int pred, simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  return simt::emu::vote(simt::emu::Vote::Ballot, "__ballot_sync", mask, pred, loc);
}
inline int __all_sync(unsigned mask, int pred, simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  return static_cast<int>(simt::emu::vote(simt::emu::Vote::All, "__all_sync", mask, pred, loc));
}
inline int __any_sync(unsigned mask, int pred, simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  return static_cast<int>(simt::emu::vote(simt::emu::Vote::Any, "__any_sync", mask, pred, loc));
}
inline void __syncwarp(unsigned mask = 0xffffffffu, simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  simt::emu::sync_warp(mask, loc);
}

// emu_warp.cpp — the combine step of every warp collective: given all lanes' operands, compute every
// lane's result exactly as the PTX ISA specifies (shfl.sync, vote.sync, mma.sync m16n8k16, ldmatrix).
#include <cstdint>
#include <cstring>
#include <string>

#include "emu_fp16.h"
#include "emu_warp.h"

#include "emu_block.h"
#include "emu_stats.h"

namespace simt::emu {
namespace {

template <typename T>
T load_in(const LaneSlot& s) {
  static_assert(sizeof(T) <= sizeof(s.in));
  T v;
  std::memcpy(&v, s.in, sizeof(T));
  return v;
}
template <typename T>
void store_out(LaneSlot& s, const T& v) {
  static_assert(sizeof(T) <= sizeof(s.out));
  std::memcpy(s.out, &v, sizeof(T));
}

}  // namespace

// shfl.sync per the PTX ISA: with segmask = c[12:8], clamp = c[4:0]
//   minLane = lane & segmask,  maxLane = minLane | (clamp & ~segmask)
//   idx: j = minLane | (b[4:0] & ~segmask)   valid if j <= maxLane
//   up:  j = lane - b                         valid if j >= maxLane   (clamp = 0: maxLane = segment start)
//   down: j = lane + b                        valid if j <= maxLane
//   bfly: j = lane ^ b                        valid if j <= maxLane
// an invalid j returns the lane's own value. Example, __shfl_xor_sync(v, 8, width 16) in lane 3:
// segmask = 16, minLane = 0, maxLane = 15, j = 11 ≤ 15 → lane 11's value; in lane 20: j = 28 ≤ 31 → ok.
void combine_shfl(LaneSlot* lanes, int nlanes) {
  uint64_t result[32];
  for (int lane = 0; lane < nlanes; ++lane) {
    const ShflIn in = load_in<ShflIn>(lanes[lane]);
    const int segmask = static_cast<int>((in.c >> 8) & 0x1f), clamp = static_cast<int>(in.c & 0x1f);
    const int min_lane = lane & segmask, max_lane = min_lane | (clamp & ~segmask);
    const int b = static_cast<int>(in.b);
    int j = lane;
    bool valid = false;
    switch (static_cast<ShflMode>(in.mode)) {
      case ShflMode::Idx: j = min_lane | (b & 0x1f & ~segmask); valid = j <= max_lane; break;
      case ShflMode::Up: j = lane - b; valid = j >= max_lane; break;
      case ShflMode::Down: j = lane + b; valid = j <= max_lane; break;
      case ShflMode::Bfly: j = lane ^ b; valid = j <= max_lane; break;
    }
    if (!valid) j = lane;
    // A lane past the end of a partial last warp does not exist: it contributes 0.
    result[lane] = j < nlanes ? load_in<ShflIn>(lanes[j]).value : 0;
  }
  for (int lane = 0; lane < nlanes; ++lane) store_out(lanes[lane], result[lane]);
}

void bad_shfl_width(int width, SrcLoc loc) {
  const std::string msg = "shuffle width " + std::to_string(width) + " is not a power of two in [1, 32]";
  kernel_fault(cudaErrorInvalidValue, msg.c_str(), loc);
}

// ---- votes and __syncwarp ------------------------------------------------------------------------------
namespace {
struct VoteIn {
  uint32_t pred, op;
};
void combine_vote(LaneSlot* lanes, int nlanes) {
  unsigned ballot = 0;
  for (int lane = 0; lane < nlanes; ++lane) ballot |= (load_in<VoteIn>(lanes[lane]).pred ? 1u : 0u) << lane;
  const unsigned all_mask = nlanes == 32 ? 0xffffffffu : (1u << nlanes) - 1;
  for (int lane = 0; lane < nlanes; ++lane) {
    unsigned r = ballot;
    switch (static_cast<Vote>(load_in<VoteIn>(lanes[lane]).op)) {
      case Vote::Ballot: r = ballot; break;
      case Vote::All: r = ballot == all_mask; break;
      case Vote::Any: r = ballot != 0; break;
    }
    store_out(lanes[lane], r);
  }
}
void combine_nothing(LaneSlot*, int) {}
}  // namespace

unsigned vote(Vote op, const char* what, unsigned mask, int pred, SrcLoc loc) {
  LaneSlot& slot = lane_slot();
  const VoteIn in{pred != 0, static_cast<uint32_t>(op)};
  std::memcpy(slot.in, &in, sizeof in);
  warp_collective(what, mask, &combine_vote, loc);
  unsigned r;
  std::memcpy(&r, slot.out, sizeof r);
  return r;
}

void sync_warp(unsigned mask, SrcLoc loc) { warp_collective("__syncwarp", mask, &combine_nothing, loc); }

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 ----------------------------------
// Fragment layouts (PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point type"), with
// g = lane >> 2 (groupID) and t = lane % 4 (threadID_in_group); a 32-bit register holds two 16-bit
// elements, the lower-indexed one in the low half:
//   A 16×16 (row): a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]
//                  a[2] = A[g][2t+8, 2t+9] a[3] = A[g+8][2t+8, 2t+9]
//   B 16×8  (col): b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   C, D 16×8 f32: c[0] = C[g][2t]  c[1] = C[g][2t+1]  c[2] = C[g+8][2t]  c[3] = C[g+8][2t+1]
// Worked example, lane 5 (g = 1, t = 1): a[0] = A[1][2..3], a[1] = A[9][2..3], a[2] = A[1][10..11],
// a[3] = A[9][10..11]; b[0] = B[2..3][1], b[1] = B[10..11][1]; d = D[1][2], D[1][3], D[9][2], D[9][3].
// Products of 16-bit floats are exact in double; the 16 products and c are summed in double and rounded
// once to fp32 (hardware accumulation order/truncation differs in the last bits).
namespace {
struct MmaIn {
  uint32_t a[4], b[2];
  float c[4];
};

template <bool BF16>
float elem(uint32_t reg, int half) {
  const auto bits = static_cast<uint16_t>(reg >> (16 * half));
  return BF16 ? bf16_bits_to_float(bits) : ::mk::fp16_bits_to_float(bits);
}

template <bool BF16>
void combine_mma(LaneSlot* lanes, int nlanes) {
  if (nlanes != 32) kernel_fault(cudaErrorLaunchFailure, "mma.sync needs a complete warp of 32 lanes");
  float A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const MmaIn in = load_in<MmaIn>(lanes[lane]);
    const int g = lane >> 2, t = lane & 3;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = elem<BF16>(in.a[0], h);
      A[g + 8][2 * t + h] = elem<BF16>(in.a[1], h);
      A[g][2 * t + 8 + h] = elem<BF16>(in.a[2], h);
      A[g + 8][2 * t + 8 + h] = elem<BF16>(in.a[3], h);
      B[2 * t + h][g] = elem<BF16>(in.b[0], h);
      B[2 * t + 8 + h][g] = elem<BF16>(in.b[1], h);
      C[g][2 * t + h] = in.c[h];
      C[g + 8][2 * t + h] = in.c[2 + h];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    float d[4];
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
      double acc = C[row][col];
      for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[row][k]) * B[k][col];
      d[i] = static_cast<float>(acc);
    }
    store_out(lanes[lane], d);
  }
}
}  // namespace

void mma_m16n8k16(bool bf16, float* d, const uint32_t* a, const uint32_t* b, const float* c, SrcLoc loc) {
  LaneSlot& slot = lane_slot();
  MmaIn in;
  std::memcpy(in.a, a, sizeof in.a);
  std::memcpy(in.b, b, sizeof in.b);
  std::memcpy(in.c, c, sizeof in.c);
  std::memcpy(slot.in, &in, sizeof in);
  warp_collective(bf16 ? "mma.sync.m16n8k16.bf16" : "mma.sync.m16n8k16.f16", kFullMask,
                  bf16 ? &combine_mma<true> : &combine_mma<false>, loc);
  std::memcpy(d, slot.out, 4 * sizeof(float));  // d may alias c: read only after the collective
}

// ---- ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 ------------------------------------------
// Matrix i (i < num) is 8 rows × 8 b16; lane 8i + r supplies the (16-byte aligned) address of its row r.
// Addresses from lanes ≥ 8·num are ignored. Result register r[i] of lane l, with g = l >> 2, t = l % 4:
//   plain:  { M_i[g][2t],  M_i[g][2t+1] }     (row g, the 16-bit pair at byte offset 4t)
//   .trans: { M_i[2t][g],  M_i[2t+1][g] }     (column g of rows 2t and 2t+1)
// Worked example, lane 9 (g = 2, t = 1) of an .x4: r[0] = row 2 of matrix 0, columns 2 and 3, read from
// the address lane 2 supplied; with .trans r[0] = elements (2, 2) and (3, 2) of matrix 0. This is the
// A/B operand layout of mma.m16n8k16, which is why ldmatrix feeds mma directly.
namespace {
template <int NUM, bool TRANS>
void combine_ldmatrix(LaneSlot* lanes, int nlanes) {
  if (nlanes != 32) kernel_fault(cudaErrorLaunchFailure, "ldmatrix needs a complete warp of 32 lanes");
  uint16_t M[NUM][8][8];
  for (int i = 0; i < NUM; ++i)
    for (int r = 0; r < 8; ++r) {
      const auto addr = load_in<uint64_t>(lanes[8 * i + r]);
      if (addr % 16 != 0) {
        const std::string msg = "ldmatrix: row address " + std::to_string(addr) + " supplied by lane " +
                                std::to_string(8 * i + r) + " is not 16-byte aligned";
        kernel_fault(cudaErrorMisalignedAddress, msg.c_str());
      }
      std::memcpy(M[i][r], reinterpret_cast<const void*>(addr), 16);
    }
  if (BlockRunner* runner = BlockRunner::active()) {  // MK_SIMT_STATS: one shared-memory phase per matrix
    for (int i = 0; i < NUM; ++i) {
      uintptr_t rows[8];
      for (int r = 0; r < 8; ++r) rows[r] = load_in<uint64_t>(lanes[8 * i + r]);
      stats::ldmatrix_phase(rows, runner->current_loc());
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    uint32_t out[4] = {0, 0, 0, 0};
    for (int i = 0; i < NUM; ++i) {
      const uint16_t lo = TRANS ? M[i][2 * t][g] : M[i][g][2 * t];
      const uint16_t hi = TRANS ? M[i][2 * t + 1][g] : M[i][g][2 * t + 1];
      out[i] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
    }
    store_out(lanes[lane], out);
  }
}

template <int NUM>
Combine ldmatrix_combine(bool trans) {
  return trans ? &combine_ldmatrix<NUM, true> : &combine_ldmatrix<NUM, false>;
}
}  // namespace

void ldmatrix(int num, bool trans, uint32_t* r, const void* row_addr, SrcLoc loc) {
  static const char* const names[2][3] = {
      {"ldmatrix.m8n8.x1", "ldmatrix.m8n8.x2", "ldmatrix.m8n8.x4"},
      {"ldmatrix.m8n8.x1.trans", "ldmatrix.m8n8.x2.trans", "ldmatrix.m8n8.x4.trans"}};
  const int which = num == 1 ? 0 : num == 2 ? 1 : 2;
  const Combine fn = num == 1 ? ldmatrix_combine<1>(trans) : num == 2 ? ldmatrix_combine<2>(trans)
                                                                      : ldmatrix_combine<4>(trans);
  LaneSlot& slot = lane_slot();
  const auto addr = reinterpret_cast<uint64_t>(row_addr);
  std::memcpy(slot.in, &addr, sizeof addr);
  warp_collective(names[trans][which], kFullMask, fn, loc);
  std::memcpy(r, slot.out, static_cast<size_t>(num) * sizeof(uint32_t));
}

}  // namespace simt::emu

// emu_runtime.h — what emulated kernel code calls into: the built-in index variables, barriers, the
// warp-collective mailbox, dynamic shared memory, cp.async bookkeeping and the grid launcher.
// Implemented in emu_block.cpp / emu_launch.cpp. Every function that can suspend the calling thread
// (barriers, collectives) is out of line, so the compiler reloads memory — and threadIdx — after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>

#include "emu_types.h"

// The built-in variables: per OS thread, rewritten by the scheduler before it resumes a fiber (a fiber
// never migrates between OS threads).
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{1, 1, 1};
inline thread_local dim3 gridDim{1, 1, 1};
constexpr int warpSize = 32;

namespace simt::emu {

using SrcLoc = std::source_location;
constexpr unsigned kFullMask = 0xffffffffu;

// ---- warp collectives ----------------------------------------------------------------------------
// Each lane writes its operands into its LaneSlot, then calls warp_collective(). When the last lane of
// the warp arrives, `combine` runs once over all lanes' slots (inputs captured at that moment, e.g.
// the shared memory ldmatrix reads), fills every `out`, and the lanes resume and read their own `out`.
struct LaneSlot {
  alignas(16) unsigned char in[48];
  alignas(16) unsigned char out[16];
};
using Combine = void (*)(LaneSlot* lanes, int nlanes);

LaneSlot& lane_slot();
// `what` names the operation in reports. A mask other than all 32 lanes is reported as a DEADLOCK:
// the emulator synchronises whole warps only.
void warp_collective(const char* what, unsigned mask, Combine combine, SrcLoc loc);

// ---- block barrier -------------------------------------------------------------------------------
enum class BarrierReduce : int { None, Count, And, Or };
// __syncthreads (and its _count/_and/_or forms): all threads of the block must arrive at the same
// call site; returns the reduction of `pred` over the block (0 for None).
int block_barrier(const char* what, BarrierReduce op, int pred, SrcLoc loc);

// ---- memory --------------------------------------------------------------------------------------
void* dynamic_smem();  // this block's dynamic shared memory (16-byte aligned, poisoned with 0xff)
// cp.async: queued per thread, performed by cp_async_wait (as late as the PTX memory model allows, so
// a missing wait shows up as stale shared memory). Copies `src_bytes` from src, zero-fills to `bytes`.
void cp_async_issue(void* dst, const void* src, unsigned bytes, unsigned src_bytes, SrcLoc loc);
void cp_async_commit();
void cp_async_wait(int pending_groups_allowed);  // cp.async.wait_group N

// A fault detected inside a kernel (e.g. a misaligned ldmatrix row): the launch fails with `code`.
[[noreturn]] void kernel_fault(cudaError_t code, const char* what, SrcLoc loc);
// The same from a collective's combine step: located at the current thread's collective call.
[[noreturn]] void kernel_fault(cudaError_t code, const char* what);

// ---- launch --------------------------------------------------------------------------------------
struct LaunchSpec {
  dim3 grid, block;
  size_t smem_bytes;
  void (*thunk)(const void* closure);  // calls the kernel with the launch's parameters
  const void* closure;
  const void* kernel;  // for the kernel's name in reports
};
cudaError_t run_grid(const LaunchSpec& spec);

}  // namespace simt::emu

// ---- CUDA names ----------------------------------------------------------------------------------
inline void __syncthreads(simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  simt::emu::block_barrier("__syncthreads()", simt::emu::BarrierReduce::None, 0, loc);
}
inline int __syncthreads_count(int pred, simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  return simt::emu::block_barrier("__syncthreads_count()", simt::emu::BarrierReduce::Count, pred, loc);
}
inline int __syncthreads_and(int pred, simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  return simt::emu::block_barrier("__syncthreads_and()", simt::emu::BarrierReduce::And, pred, loc);
}
inline int __syncthreads_or(int pred, simt::emu::SrcLoc loc = simt::emu::SrcLoc::current()) {
  return simt::emu::block_barrier("__syncthreads_or()", simt::emu::BarrierReduce::Or, pred, loc);
}

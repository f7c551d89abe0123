// emu_stats.h — (internal) MK_SIMT_STATS=1: per-launch grid-waste and memory-efficiency counters computed
// exactly from the emulated execution (no kernel changes).
//
// Grid waste: a block is *empty* when it exits without reaching a barrier, a warp collective or a global
// store (it only read its indices and returned).
// Memory efficiency, per warp-level instruction (the k-th execution of one access site by the lanes of a
// warp, grouped after the block ran):
//   global: distinct bytes used vs 32-byte sectors touched (coalescing efficiency = bytes / (32 · sectors);
//           allocations are assumed 32-byte aligned, as cudaMalloc's 256-byte alignment makes them);
//   shared: bank conflicts — 32 banks of 4 bytes; a 4-byte access is one phase of 32 lanes, 8-byte two
//           phases of 16, 16-byte four phases of 8 (ldmatrix: one phase per 8×8 matrix); a phase costs as
//           many wavefronts as the most distinct 4-byte words any one bank serves (same word: broadcast).
// An access continuing the same thread's previous one inside one 16-byte chunk is merged with it (g++
// splits some vector copies into scalar ones; two adjacent scalar accesses count as one vector access).
// Sources: plain loads / stores of the kernel code reach us through the compiler's address-sanitizer
// callbacks (`-fsanitize=kernel-address` with outline calls, no ASan runtime; emu_stats.cpp defines the
// callbacks): the module instruments stores only (grid waste, ~10 % cost), the standalone stats programs of
// tests/emu instrument loads too; ldmatrix and cp.async report themselves from the emulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "emu_runtime.h"

namespace simt::emu::stats {

struct SiteStats {
  std::string site;         // "file:line" (emulator instructions) or "pc 0x…" (compiled accesses)
  bool shared = false, store = false;
  uint64_t instructions = 0;     // warp-level executions
  uint64_t bytes = 0;            // bytes the lanes accessed (global: distinct bytes per instruction)
  uint64_t sectors = 0;          // global: 32-byte sectors touched
  uint64_t wavefronts = 0;       // shared: wavefronts issued …
  uint64_t ideal_wavefronts = 0; // … and without bank conflicts
  unsigned max_degree = 0;       // shared: worst bank-conflict degree of one phase (1: conflict-free)
  uintptr_t lo = UINTPTR_MAX, hi = 0;  // address range touched [lo, hi)
  double efficiency() const { return sectors ? static_cast<double>(bytes) / (32.0 * sectors) : 1.0; }
};

struct LaunchStats {
  std::string kernel;
  dim3 grid, block;
  size_t smem_bytes = 0;
  uint64_t blocks = 0, empty_blocks = 0;
  std::vector<SiteStats> sites;
};

// MK_SIMT_STATS=1 (read at every launch).
bool enabled_by_env();

// The launches recorded since the last clear (in launch order), and clearing.
std::vector<LaunchStats> launches();
void clear();
// JSON array of the recorded launches (the Python accessor's format), then optionally clear.
std::string json(bool reset);

// ---- called by the emulator ----------------------------------------------------------------------------
struct BlockContext {
  const void* smem_lo;  // dynamic shared memory
  const void* smem_hi;
  const void* stacks_lo;  // every fiber stack of this OS thread (locals: not memory traffic)
  const void* stacks_hi;
  int threads;
};
void launch_begin(const LaunchSpec& spec);   // on the launching thread, before any block
void launch_end();                           // after all blocks: publishes the launch's record
void block_begin(const BlockContext& ctx);   // on the OS thread that runs the block
void block_end(bool completed);              // merges the block into the launch
void set_thread(int index);                  // the fiber about to run (index in the block)
void note_sync();                            // a barrier or collective was reached
// An emulator instruction's accesses for one lane (site = its source location).
void access(const void* addr, unsigned bytes, bool store, SrcLoc site);
// ldmatrix: the 8 row addresses of one 8×8 matrix, read by one phase.
void ldmatrix_phase(const uintptr_t* rows, SrcLoc site);

}  // namespace simt::emu::stats

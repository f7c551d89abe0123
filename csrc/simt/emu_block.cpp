// emu_block.cpp — one thread block as cooperative fibers (see emu_block.h).
//
// Scheduling: the scheduler context (the OS thread's own stack) repeatedly walks the block's threads in
// the schedule order (forward / reverse / a fresh random permutation per round) and resumes every
// runnable one; a thread runs until it waits at a barrier or collective, or exits. The last thread to
// reach a barrier releases the others and yields too, so every phase between barriers runs in schedule
// order. A round in which nobody could run while some threads are still waiting is a deadlock.
#include "emu_block.h"

#include "emu_stats.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define SIMT_EMU_ASAN 1
#else
#define SIMT_EMU_ASAN 0
#endif

namespace simt::emu {

namespace {
thread_local BlockRunner* tl_active = nullptr;  // set while a block runs on this OS thread

const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
std::string at(SrcLoc loc) { return std::string(basename_of(loc.file_name())) + ":" + std::to_string(loc.line()); }
std::string xyz(uint3 v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "(%u,%u,%u)", v.x, v.y, v.z);
  return buf;
}
bool same_site(SrcLoc a, SrcLoc b) {
  return a.line() == b.line() && a.column() == b.column() && std::strcmp(a.file_name(), b.file_name()) == 0;
}
std::string xyz(dim3 v) { return xyz(static_cast<uint3>(v)); }

}  // namespace

std::string kernel_name(const void* kernel) {
  Dl_info info{};
  if (kernel && dladdr(kernel, &info) && info.dli_sname) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string name = status == 0 && demangled ? demangled : info.dli_sname;
    std::free(demangled);
    return name;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", kernel);
  return std::string("<kernel at ") + buf + ">";
}

BlockRunner& this_thread_runner() {
  thread_local BlockRunner runner;
  return runner;
}
BlockRunner* BlockRunner::active() { return tl_active; }

// ---- running a block -----------------------------------------------------------------------------------
bool BlockRunner::run(const LaunchSpec& spec, const Schedule& schedule, uint64_t block, Failure& failure, bool stats) {
  const int n = static_cast<int>(spec.block.x * spec.block.y * spec.block.z);
  if (!stacks_.reserve(n, fiber_stack_size())) {
    failure = {cudaErrorMemoryAllocation, "SIMT emulator: could not map " + std::to_string(n) + " fiber stacks"};
    return false;
  }
  if (spec.smem_bytes + 16 > smem_capacity_) {
    std::free(smem_);
    smem_capacity_ = (spec.smem_bytes + 16 + 4095) / 4096 * 4096;
    smem_ = static_cast<unsigned char*>(std::aligned_alloc(128, smem_capacity_));
  }
  std::memset(smem_, 0xff, spec.smem_bytes);  // poison: NaN / -1, so reading unwritten smem shows
#if SIMT_EMU_ASAN
  // A fiber's outermost frame (fiber_main) never returns, so ASan's redzones for it stay poisoned, and
  // after a failed block so do all frames of the abandoned threads: clear the shadow before reuse.
  for (int i = 0; i < n; ++i) {
    const size_t clear = dirty_stacks_ ? stacks_.size() : 8192;
    ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(stacks_.lo(i)) + stacks_.size() - clear, clear);
  }
#endif
  dirty_stacks_ = false;

  blockIdx = {static_cast<unsigned>(block % spec.grid.x), static_cast<unsigned>(block / spec.grid.x % spec.grid.y),
              static_cast<unsigned>(block / spec.grid.x / spec.grid.y)};
  blockDim = spec.block;
  gridDim = spec.grid;
  spec_ = &spec;
  failure_ = &failure;
  failed_ = false;
  barrier_arrived_ = 0;

  fibers_.resize(n);
  warps_.resize((n + 31) / 32);
  for (int w = 0; w < static_cast<int>(warps_.size()); ++w) warps_[w] = Warp{0, std::min(32, n - 32 * w), nullptr, SrcLoc::current(), {}};
  for (int i = 0; i < n; ++i) {
    Fiber& f = fibers_[i];
    f.tid = {static_cast<unsigned>(i % spec.block.x), static_cast<unsigned>(i / spec.block.x % spec.block.y),
             static_cast<unsigned>(i / spec.block.x / spec.block.y)};
    f.index = i;
    f.state = State::Runnable;
    f.what = nullptr;
    f.asan_fake_stack = nullptr;
    f.copies.clear();
    f.copies_done = 0;
    f.group_ends.clear();
    context_make(f.ctx, stacks_.lo(i), stacks_.size(), &BlockRunner::fiber_main, &f);
  }

  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (schedule.kind == ScheduleKind::Reverse) std::reverse(order.begin(), order.end());
  std::mt19937_64 rng(schedule.seed ^ (block * 0x9e3779b97f4a7c15ull));

  BlockRunner* const outer = tl_active;
  tl_active = this;
  stats_ = stats;
  if (stats_)
    stats::block_begin({smem_, smem_ + spec.smem_bytes, stacks_.begin(), stacks_.end(), n});
  int exited = 0;
  while (!failed_) {
    if (schedule.kind == ScheduleKind::Random) std::shuffle(order.begin(), order.end(), rng);
    bool progressed = false;
    for (int i : order) {
      Fiber& f = fibers_[i];
      if (f.state != State::Runnable) continue;
      progressed = true;
      resume(f);
      if (failed_) break;
      if (f.state == State::Exited) ++exited;
    }
    if (failed_ || exited == n) break;
    if (!progressed) {
      failure = {cudaErrorLaunchFailure, report("DEADLOCK: no thread of the block can proceed")};
      failed_ = true;
    }
  }
  if (stats_) stats::block_end(!failed_);
  tl_active = outer;
  dirty_stacks_ = failed_;
  spec_ = nullptr;
  return !failed_;
}

void BlockRunner::fiber_main(void* p) {
  Fiber& f = *static_cast<Fiber*>(p);
  BlockRunner& r = *tl_active;
#if SIMT_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &r.sched_stack_bottom_, &r.sched_stack_size_);
#endif
  try {
    r.spec_->thunk(r.spec_->closure);
  } catch (...) {
    r.fault(cudaErrorLaunchFailure, "a C++ exception escaped the kernel");
  }
  r.check_no_pending_copies(f);
  f.state = State::Exited;
  r.to_scheduler(f, /*exiting=*/true);
  std::abort();  // an exited fiber is never resumed
}

void BlockRunner::resume(Fiber& f) {
  threadIdx = f.tid;
  current_ = &f;
  if (stats_) stats::set_thread(f.index);
#if SIMT_EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, stacks_.lo(f.index), stacks_.size());
#endif
  context_switch(sched_, f.ctx);
#if SIMT_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
  current_ = nullptr;
}

void BlockRunner::to_scheduler(Fiber& f, bool exiting) {
#if SIMT_EMU_ASAN
  __sanitizer_start_switch_fiber(exiting ? nullptr : &f.asan_fake_stack, sched_stack_bottom_, sched_stack_size_);
#else
  (void)exiting;
#endif
  context_switch(f.ctx, sched_);
#if SIMT_EMU_ASAN
  __sanitizer_finish_switch_fiber(f.asan_fake_stack, &sched_stack_bottom_, &sched_stack_size_);
#endif
}

// ---- barriers and collectives ------------------------------------------------------------------------
LaneSlot& BlockRunner::lane_slot() { return warps_[current_->index / 32].lanes[current_->index % 32]; }

void BlockRunner::warp_collective(const char* what, unsigned mask, Combine combine, SrcLoc loc) {
  Fiber& f = *current_;
  f.what = what;
  f.loc = loc;
  if (mask != kFullMask) {
    char m[16];
    std::snprintf(m, sizeof m, "0x%08x", mask);
    fault(cudaErrorLaunchFailure, std::string("DEADLOCK: partial-mask collective ") + what + "(mask=" + m + ") at " +
                                      at(loc) + " — the emulator synchronises whole warps only; use full-warp masks");
  }
  if (stats_) stats::note_sync();
  Warp& w = warps_[f.index / 32];
  if (w.arrived == 0) {
    w.combine = combine;
    w.loc = loc;
  } else if (w.combine != combine) {
    fault(cudaErrorLaunchFailure, std::string("DEADLOCK: lanes of warp ") + std::to_string(f.index / 32) +
                                      " wait at different warp collectives (this one: " + what + " at " + at(loc) + ")");
  } else if (!same_site(w.loc, loc) && std::strcmp(what, "__syncwarp") != 0) {
    // The same collective at two call sites (e.g. one shuffle in each branch of a divergent `if`): the
    // emulator would combine their operands as if they were one instruction; .aligned instructions
    // (mma, ldmatrix) require one instruction, and shuffles / votes from two sites only meet by accident of
    // the compiler's reconvergence. __syncwarp may legally differ in call site (sm_70+).
    fault(cudaErrorLaunchFailure, std::string("DEADLOCK: lanes of warp ") + std::to_string(f.index / 32) + " reach " +
                                      what + " at different call sites: " + at(w.loc) + " and " + at(loc) +
                                      " — a warp collective must be one call that all 32 lanes reach together");
  }
  f.state = State::AtWarp;
  if (++w.arrived == w.nlanes) {
    w.arrived = 0;
    combine(w.lanes, w.nlanes);
    for (int l = 0; l < w.nlanes; ++l) fibers_[f.index / 32 * 32 + l].state = State::Runnable;
  }
  to_scheduler(f, false);
}

int BlockRunner::block_barrier(const char* what, BarrierReduce op, int pred, SrcLoc loc) {
  Fiber& f = *current_;
  f.what = what;
  f.loc = loc;
  f.pred = pred != 0;
  f.state = State::AtBarrier;
  if (stats_) stats::note_sync();
  if (++barrier_arrived_ == static_cast<int>(fibers_.size())) {
    barrier_arrived_ = 0;
    int count = 0;
    for (const Fiber& o : fibers_) {
      if (std::strcmp(o.what, what) != 0 || o.loc.line() != loc.line() || std::strcmp(o.loc.file_name(), loc.file_name()) != 0)
        fault(cudaErrorLaunchFailure, "DEADLOCK: the threads of the block wait at different barriers");
      count += o.pred;
    }
    const int n = static_cast<int>(fibers_.size());
    barrier_result_ = op == BarrierReduce::Count ? count
                      : op == BarrierReduce::And ? count == n
                      : op == BarrierReduce::Or  ? count > 0
                                                 : 0;
    for (Fiber& o : fibers_) o.state = State::Runnable;
  }
  to_scheduler(f, false);
  return barrier_result_;  // stable until the next barrier completes, which needs this thread first
}

// ---- cp.async ------------------------------------------------------------------------------------------
void BlockRunner::cp_async_issue(void* dst, const void* src, unsigned bytes, unsigned src_bytes, SrcLoc loc) {
  if (reinterpret_cast<uintptr_t>(dst) % bytes || reinterpret_cast<uintptr_t>(src) % bytes) {
    current_->what = "cp.async";
    current_->loc = loc;
    fault(cudaErrorMisalignedAddress,
          "cp.async of " + std::to_string(bytes) + " bytes needs " + std::to_string(bytes) + "-byte aligned addresses");
  }
  // The hardware may land the bytes at any moment between issue and wait: poison the destination now
  // (0xff: NaN / -1), copy at the wait. A thread still reading the old contents after another thread
  // issued a copy into them (a missing barrier before stage reuse) reads poison instead of plausible data.
  std::memset(dst, 0xff, bytes);
  if (stats_) {
    stats::access(dst, bytes, /*store=*/true, loc);
    stats::access(src, src_bytes < bytes ? src_bytes : bytes, /*store=*/false, loc);
  }
  current_->copies.push_back({dst, src, bytes, src_bytes < bytes ? src_bytes : bytes, loc});
}

void BlockRunner::cp_async_commit() { current_->group_ends.push_back(current_->copies.size()); }

void BlockRunner::cp_async_wait(int allowed) {
  Fiber& f = *current_;
  const auto groups = static_cast<int>(f.group_ends.size());
  if (groups <= allowed) return;
  const size_t upto = f.group_ends[groups - allowed - 1];
  f.group_ends.erase(f.group_ends.begin(), f.group_ends.begin() + (groups - allowed));
  perform_copies(f, upto);
}

void BlockRunner::perform_copies(Fiber& f, size_t upto) {
  for (; f.copies_done < upto; ++f.copies_done) {
    const Copy& c = f.copies[f.copies_done];
    std::memcpy(c.dst, c.src, c.src_bytes);
    std::memset(static_cast<char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
  }
  if (f.copies_done == f.copies.size() && f.group_ends.empty()) {
    f.copies.clear();
    f.copies_done = 0;
  }
}

// A thread must not exit with copies in flight: on the GPU they may land after the thread's (or its
// block's) later stores to the same shared memory, or after the block's shared memory is reassigned.
// Empty groups (commit with nothing issued) are harmless and allowed.
void BlockRunner::check_no_pending_copies(Fiber& f) {
  if (f.copies_done == f.copies.size()) return;
  const Copy& first = f.copies[f.copies_done];
  const size_t pending = f.copies.size() - f.copies_done;
  size_t open_groups = 0;
  for (size_t end : f.group_ends) open_groups += end > f.copies_done;
  const bool uncommitted = f.group_ends.empty() || f.group_ends.back() < f.copies.size();
  f.what = "thread exit";
  f.loc = first.loc;
  fault(cudaErrorLaunchFailure,
        "cp.async still pending at thread exit: threadIdx " + xyz(f.tid) + " of blockIdx " + xyz(blockIdx) + " has " +
            std::to_string(pending) + " cop" + (pending == 1 ? "y" : "ies") + " in flight (" +
            std::to_string(open_groups) + " committed group(s) not waited for" +
            (uncommitted ? ", plus copies never committed" : "") + "; first issued at " + at(first.loc) +
            ") — cp_async_wait<0>() before the thread exits");
}

// ---- failures and reports -----------------------------------------------------------------------------
void BlockRunner::fault(cudaError_t code, const std::string& headline) {
  Fiber& f = *current_;
  f.state = State::Faulted;
  if (!failed_) *failure_ = {code, report(headline)};
  failed_ = true;
  to_scheduler(f, /*exiting=*/true);
  std::abort();  // a faulted fiber is never resumed
}

SrcLoc BlockRunner::current_loc() const { return current_ ? current_->loc : SrcLoc::current(); }

std::string BlockRunner::block_name() const {
  return "kernel " + kernel_name(spec_->kernel) + ", blockIdx " + xyz(blockIdx) + " of gridDim " + xyz(spec_->grid) +
         ", blockDim " + xyz(spec_->block);
}

std::string BlockRunner::where() const {
  return "kernel " + kernel_name(spec_->kernel) + ", blockIdx " + xyz(blockIdx) + ", threadIdx " + xyz(threadIdx);
}

std::string BlockRunner::describe(const Fiber& f) const {
  switch (f.state) {
    case State::Runnable: return f.what ? "runnable (after " + std::string(f.what) + " at " + at(f.loc) + ")" : "not started";
    case State::AtBarrier: return std::string("waiting at ") + f.what + " " + at(f.loc);
    case State::AtWarp: {
      const Warp& w = warps_[f.index / 32];
      return std::string("waiting at ") + f.what + " " + at(f.loc) + " (warp " + std::to_string(f.index / 32) + ": " +
             std::to_string(w.arrived) + " of " + std::to_string(w.nlanes) + " lanes arrived)";
    }
    case State::Exited: return "exited";
    case State::Faulted: return std::string("faulted here") + (f.what ? std::string(" at ") + f.what + " " + at(f.loc) : "");
  }
  return "?";
}

// Headline, then one line per run of consecutive threads in the same state:
//   threadIdx (0,0,0)..(15,0,0) [16 threads]: waiting at __shfl_xor_sync kernel.cuh:42 (warp 0: 16 of 32 lanes arrived)
std::string BlockRunner::report(const std::string& headline) const {
  std::string out = "SIMT emulator: " + headline + "\n  in " + block_name() + "\n  thread states:";
  const int n = static_cast<int>(fibers_.size());
  for (int i = 0; i < n;) {
    const std::string state = describe(fibers_[i]);
    int j = i + 1;
    while (j < n && describe(fibers_[j]) == state) ++j;
    out += "\n    threadIdx " + xyz(fibers_[i].tid);
    if (j - i > 1) out += ".." + xyz(fibers_[j - 1].tid) + " [" + std::to_string(j - i) + " threads]";
    out += ": " + state;
    i = j;
  }
  return out;
}

// ---- the functions kernels call (emu_runtime.h) ----------------------------------------------------------
namespace {
BlockRunner& in_kernel(const char* what) {
  BlockRunner* r = BlockRunner::active();
  if (!r) {
    std::fprintf(stderr, "SIMT emulator: %s called outside an emulated kernel\n", what);
    std::abort();
  }
  return *r;
}
}  // namespace

LaneSlot& lane_slot() { return in_kernel("a warp collective").lane_slot(); }
void warp_collective(const char* what, unsigned mask, Combine combine, SrcLoc loc) {
  in_kernel(what).warp_collective(what, mask, combine, loc);
}
int block_barrier(const char* what, BarrierReduce op, int pred, SrcLoc loc) {
  return in_kernel(what).block_barrier(what, op, pred, loc);
}
void* dynamic_smem() { return in_kernel("SIMT_DYN_SMEM").dynamic_smem(); }
void cp_async_issue(void* dst, const void* src, unsigned bytes, unsigned src_bytes, SrcLoc loc) {
  in_kernel("cp.async").cp_async_issue(dst, src, bytes, src_bytes, loc);
}
void cp_async_commit() { in_kernel("cp.async.commit_group").cp_async_commit(); }
void cp_async_wait(int allowed) { in_kernel("cp.async.wait_group").cp_async_wait(allowed); }
void kernel_fault(cudaError_t code, const char* what, SrcLoc loc) {
  in_kernel(what).fault(code, std::string(what) + " at " + at(loc));
}
void kernel_fault(cudaError_t code, const char* what) {
  BlockRunner& r = in_kernel(what);
  r.fault(code, std::string(what) + " at " + at(r.current_loc()));
}

}  // namespace simt::emu

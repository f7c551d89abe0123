// emu_block.h — (internal) runs one thread block of an emulated launch: one fiber per CUDA thread,
// scheduled cooperatively on the calling OS thread; barriers, warp collectives, cp.async queues,
// deadlock detection and the thread-state report.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "emu_fiber.h"
#include "emu_runtime.h"

namespace simt::emu {

enum class ScheduleKind { Forward, Reverse, Random };
struct Schedule {
  ScheduleKind kind = ScheduleKind::Forward;
  uint64_t seed = 0;  // random: the order of block b derives from (seed, b), whatever OS thread runs it
};

struct Failure {
  cudaError_t code = cudaSuccess;
  std::string message;
};

class BlockRunner {
 public:
  // Runs block number `block` (linear, x fastest) of `spec`. On failure fills `failure`, returns false.
  // `stats`: record MK_SIMT_STATS counters for this block (emu_stats.h).
  bool run(const LaunchSpec& spec, const Schedule& schedule, uint64_t block, Failure& failure, bool stats = false);

  // Called from inside a fiber through the functions of emu_runtime.h.
  LaneSlot& lane_slot();
  void warp_collective(const char* what, unsigned mask, Combine combine, SrcLoc loc);
  int block_barrier(const char* what, BarrierReduce op, int pred, SrcLoc loc);
  void* dynamic_smem() { return smem_; }
  void cp_async_issue(void* dst, const void* src, unsigned bytes, unsigned src_bytes, SrcLoc loc);
  void cp_async_commit();
  void cp_async_wait(int allowed);
  [[noreturn]] void fault(cudaError_t code, const std::string& headline);
  SrcLoc current_loc() const;

  // The fiber running now on this OS thread, for the sanitizer hook; nullptr outside kernels.
  static BlockRunner* active();
  std::string where() const;  // "kernel K, blockIdx (..), threadIdx (..)"

 private:
  enum class State : uint8_t { Runnable, AtBarrier, AtWarp, Exited, Faulted };
  struct Copy {
    void* dst;
    const void* src;
    unsigned bytes, src_bytes;
    SrcLoc loc;  // where it was issued, for the pending-at-exit report
  };
  struct Fiber {
    Context ctx;
    uint3 tid;
    int index;
    State state;
    const char* what;  // the barrier / collective it waits at
    SrcLoc loc;
    int pred;
    void* asan_fake_stack;
    std::vector<Copy> copies;       // cp.async issued and not yet performed: [copies_done, size)
    size_t copies_done;
    std::vector<size_t> group_ends;  // committed groups not yet waited for: end index into copies
  };
  struct Warp {
    int arrived, nlanes;
    Combine combine;
    SrcLoc loc;  // call site of the first lane to arrive: the others must wait at the same one
    LaneSlot lanes[32];
  };

  static void fiber_main(void* fiber);
  void resume(Fiber& f);
  void to_scheduler(Fiber& f, bool exiting);
  void perform_copies(Fiber& f, size_t upto);
  void check_no_pending_copies(Fiber& f);
  std::string describe(const Fiber& f) const;
  std::string report(const std::string& headline) const;
  std::string block_name() const;

  Context sched_;
  std::vector<Fiber> fibers_;
  std::vector<Warp> warps_;
  StackPool stacks_;
  unsigned char* smem_ = nullptr;
  size_t smem_capacity_ = 0;
  const LaunchSpec* spec_ = nullptr;
  Fiber* current_ = nullptr;
  int barrier_arrived_ = 0, barrier_result_ = 0;
  bool failed_ = false, dirty_stacks_ = false, stats_ = false;
  Failure* failure_ = nullptr;
  const void* sched_stack_bottom_ = nullptr;  // for the AddressSanitizer fiber annotations
  size_t sched_stack_size_ = 0;
};

BlockRunner& this_thread_runner();
// Demangled name of a kernel function (dladdr; exported symbols), or its address.
std::string kernel_name(const void* kernel);

}  // namespace simt::emu

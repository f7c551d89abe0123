// emu_fiber.h — (internal) execution contexts for the SIMT emulator's fibers and their stacks.
// Fast path: a hand-written x86-64 SysV register switch (callee-saved registers + stack pointer, ~10 ns,
// no syscall). Elsewhere, or with -DMK_SIMT_UCONTEXT=1: glibc ucontext (swapcontext makes a
// sigprocmask syscall per switch, ~0.5 µs). Stacks are mmap'ed with a PROT_NONE guard page below each.
#pragma once

#include <cstddef>

#if defined(__x86_64__) && !MK_SIMT_UCONTEXT
#define SIMT_EMU_FAST_SWITCH 1
#else
#define SIMT_EMU_FAST_SWITCH 0
#include <ucontext.h>
#endif

namespace simt::emu {

struct Context {
#if SIMT_EMU_FAST_SWITCH
  void* sp = nullptr;  // saved stack pointer; the callee-saved registers sit on that stack
#else
  ucontext_t uc;
#endif
};

// Prepare `ctx` so that switching to it runs entry(arg) on [stack_lo, stack_lo + size). `entry` must
// never return: it ends by switching away for good.
void context_make(Context& ctx, void* stack_lo, size_t size, void (*entry)(void*), void* arg);
// Save the running context into `from` and resume `to`. Returns when someone switches back to `from`.
void context_switch(Context& from, Context& to);

// `count` fiber stacks of `size()` usable bytes, each above its own guard page; grows on demand.
class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool();
  bool reserve(int count, size_t size);  // false if the mapping fails
  void* lo(int i) const { return base_ + static_cast<size_t>(i) * slot_ + guard_; }
  size_t size() const { return slot_ - guard_; }
  const void* begin() const { return base_; }  // the whole mapping, guard pages included
  const void* end() const { return base_ + bytes_; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0, slot_ = 0, guard_ = 0;
  int count_ = 0;
};

// Usable stack bytes per fiber: MK_SIMT_STACK_KB, default 128 KiB (512 KiB under AddressSanitizer,
// whose redzones grow frames). Only touched pages cost memory.
size_t fiber_stack_size();

}  // namespace simt::emu

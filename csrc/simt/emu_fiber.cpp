// emu_fiber.cpp — context switch and guard-paged fiber stacks (see emu_fiber.h).
#include "emu_fiber.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>


#if SIMT_EMU_FAST_SWITCH
// simt_emu_switch(void** save_sp, void* load_sp): push the SysV callee-saved registers, store rsp, load
// the other stack, pop its registers, return into it. MXCSR / x87 control words are not switched:
// every fiber runs with the same floating-point environment.
// simt_emu_fiber_start: where a fresh stack first "returns" to; calls r13(r12) and never returns.
asm(R"(
  .text
  .globl simt_emu_switch
  .hidden simt_emu_switch
  .type simt_emu_switch, @function
  .p2align 4
simt_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size simt_emu_switch, .-simt_emu_switch

  .globl simt_emu_fiber_start
  .hidden simt_emu_fiber_start
  .type simt_emu_fiber_start, @function
  .p2align 4
simt_emu_fiber_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size simt_emu_fiber_start, .-simt_emu_fiber_start
)");
extern "C" void simt_emu_switch(void** save_sp, void* load_sp);
extern "C" void simt_emu_fiber_start();
#endif

namespace simt::emu {

#if SIMT_EMU_FAST_SWITCH
void context_make(Context& ctx, void* stack_lo, size_t size, void (*entry)(void*), void* arg) {
  // Initial stack, growing down from a 16-byte aligned top T:
  //   [T-24] simt_emu_fiber_start (popped by `ret`, leaving rsp = T-16, 16-byte aligned, so that the
  //          `call` in fiber_start enters `entry` with the ABI's rsp ≡ 8 mod 16)
  //   [T-32] rbp = 0  [T-40] rbx = 0  [T-48] r12 = arg  [T-56] r13 = entry  [T-64] r14  [T-72] r15
  auto top = (reinterpret_cast<uintptr_t>(stack_lo) + size) & ~uintptr_t{15};
  void** sp = reinterpret_cast<void**>(top - 16);
  *--sp = reinterpret_cast<void*>(&simt_emu_fiber_start);
  *--sp = nullptr;                              // rbp
  *--sp = nullptr;                              // rbx
  *--sp = arg;                                  // r12
  *--sp = reinterpret_cast<void*>(entry);       // r13
  *--sp = nullptr;                              // r14
  *--sp = nullptr;                              // r15
  ctx.sp = sp;
}

void context_switch(Context& from, Context& to) { simt_emu_switch(&from.sp, to.sp); }

#else
namespace {
// makecontext passes int arguments only: the pointers travel as two 32-bit halves.
void ucontext_entry(unsigned entry_hi, unsigned entry_lo, unsigned arg_hi, unsigned arg_lo) {
  auto entry = reinterpret_cast<void (*)(void*)>(static_cast<uintptr_t>(entry_hi) << 32 | entry_lo);
  auto arg = reinterpret_cast<void*>(static_cast<uintptr_t>(arg_hi) << 32 | arg_lo);
  entry(arg);
  std::abort();  // unreachable: entry switches away for good
}
}  // namespace

void context_make(Context& ctx, void* stack_lo, size_t size, void (*entry)(void*), void* arg) {
  getcontext(&ctx.uc);
  ctx.uc.uc_stack.ss_sp = stack_lo;
  ctx.uc.uc_stack.ss_size = size;
  ctx.uc.uc_link = nullptr;
  const auto e = reinterpret_cast<uintptr_t>(entry), a = reinterpret_cast<uintptr_t>(arg);
  makecontext(&ctx.uc, reinterpret_cast<void (*)()>(&ucontext_entry), 4, static_cast<unsigned>(e >> 32),
              static_cast<unsigned>(e), static_cast<unsigned>(a >> 32), static_cast<unsigned>(a));
}

void context_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ---- stacks ------------------------------------------------------------------------------------------
// Under AddressSanitizer a fiber that ends by switching away leaves its frames' redzones poisoned in the
// shadow memory; once the pages are unmapped and the address range is reused (e.g. by Python's heap) the
// stale poison reports false stack-buffer-underflows. Clear the shadow of every slot before unmapping.
static void unpoison(char* base, size_t bytes, size_t slot, size_t guard) {
#if defined(__SANITIZE_ADDRESS__)
  for (size_t off = 0; off < bytes; off += slot) __asan_unpoison_memory_region(base + off + guard, slot - guard);
#else
  (void)base, (void)bytes, (void)slot, (void)guard;
#endif
}

StackPool::~StackPool() {
  if (base_) {
    unpoison(base_, bytes_, slot_, guard_);
    munmap(base_, bytes_);
  }
}

bool StackPool::reserve(int count, size_t size) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size = (size + page - 1) / page * page;
  if (base_ && count <= count_ && size + page == slot_) return true;
  if (base_) {
    unpoison(base_, bytes_, slot_, guard_);
    munmap(base_, bytes_);
  }
  base_ = nullptr;
  guard_ = page;
  slot_ = size + page;
  bytes_ = slot_ * static_cast<size_t>(count);
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1,
                 0);
  if (p == MAP_FAILED) return false;
  base_ = static_cast<char*>(p);
  count_ = count;
  for (int i = 0; i < count; ++i) mprotect(base_ + static_cast<size_t>(i) * slot_, guard_, PROT_NONE);
  return true;
}

size_t fiber_stack_size() {
#if defined(__SANITIZE_ADDRESS__)
  size_t kb = 512;
#else
  size_t kb = 128;
#endif
  if (const char* env = std::getenv("MK_SIMT_STACK_KB")) {
    const long v = std::strtol(env, nullptr, 10);
    if (v >= 16) kb = static_cast<size_t>(v);
  }
  return kb * 1024;
}

}  // namespace simt::emu

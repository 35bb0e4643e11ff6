#include "kernels/cuda/simt/fiber_context.h"

#include <cstdint>
#include <cstring>

namespace attnserve::cuda::simt::emulator {

#if defined(__x86_64__)

// attnserve_simt_switch(void** save_sp, void* load_sp): pushes the callee-saved registers and the
// MXCSR / x87 control words on the current stack, stores the stack pointer in *save_sp, loads
// load_sp and pops the same frame from it. `ret` then continues the resumed fiber where it called
// this function (or, the first time, at its entry: see MakeFiber).
extern "C" void attnserve_simt_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .globl attnserve_simt_switch
  .hidden attnserve_simt_switch
  .type attnserve_simt_switch, @function
attnserve_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size attnserve_simt_switch, .-attnserve_simt_switch
)");

void MakeFiber(FiberContext& fiber, char* stack, size_t stack_bytes, void (*entry)()) {
  // The frame attnserve_simt_switch pops, top down: a dummy return address for entry (it never
  // returns), entry itself (the `ret` target), six zeroed registers and the control words. After
  // the `ret`, rsp is 8 mod 16, as at the start of any called function.
  auto top = reinterpret_cast<uintptr_t>(stack + stack_bytes) & ~uintptr_t{15};
  auto* slots = reinterpret_cast<uint64_t*>(top);
  slots[-1] = 0;
  slots[-2] = reinterpret_cast<uint64_t>(entry);
  for (int r = 3; r <= 8; ++r) slots[-r] = 0;
  uint32_t mxcsr = 0;
  uint16_t x87_control = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(x87_control));
  uint64_t control_words = 0;
  std::memcpy(&control_words, &mxcsr, sizeof(mxcsr));
  std::memcpy(reinterpret_cast<char*>(&control_words) + 4, &x87_control, sizeof(x87_control));
  slots[-9] = control_words;
  fiber.stack_pointer = &slots[-9];
}

void SwitchFiber(FiberContext& from, FiberContext& to) {
  attnserve_simt_switch(&from.stack_pointer, to.stack_pointer);
}

#else  // Portable: ucontext.

void MakeFiber(FiberContext& fiber, char* stack, size_t stack_bytes, void (*entry)()) {
  getcontext(&fiber.context);
  fiber.context.uc_stack.ss_sp = stack;
  fiber.context.uc_stack.ss_size = stack_bytes;
  fiber.context.uc_link = nullptr;  // entry never returns.
  makecontext(&fiber.context, entry, 0);
}

void SwitchFiber(FiberContext& from, FiberContext& to) { swapcontext(&from.context, &to.context); }

#endif

}  // namespace attnserve::cuda::simt::emulator

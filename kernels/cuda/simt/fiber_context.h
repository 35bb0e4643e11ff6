// The emulator's fiber switch: one emulated CUDA thread's suspended registers and stack, and the
// switch between two of them on the calling OS thread.
//
// Why not ucontext: swapcontext saves and restores the signal mask with a sigprocmask system call
// on every switch, and the emulator switches at every barrier, shuffle and mma of every emulated
// thread; on x86-64 that syscall was about half the emulated sweep's time. A fiber here never
// changes its signal mask, so x86-64 switches only the callee-saved registers, the SSE/x87 control
// words and the stack pointer (System V ABI); other architectures keep ucontext.
#ifndef ATTNSERVE_KERNELS_CUDA_SIMT_FIBER_CONTEXT_H_
#define ATTNSERVE_KERNELS_CUDA_SIMT_FIBER_CONTEXT_H_

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace attnserve::cuda::simt::emulator {

struct FiberContext {
#if defined(__x86_64__)
  void* stack_pointer = nullptr;  // Where the suspended fiber's saved registers sit.
#else
  ucontext_t context;
#endif
};

// Prepares `fiber` to run entry() on [stack, stack + stack_bytes) from the first switch into it.
// entry must never return: it ends by switching away for the last time.
void MakeFiber(FiberContext& fiber, char* stack, size_t stack_bytes, void (*entry)());

// Suspends the caller into `from` and resumes `to`; returns when something switches back to
// `from`.
void SwitchFiber(FiberContext& from, FiberContext& to);

}  // namespace attnserve::cuda::simt::emulator

#endif  // ATTNSERVE_KERNELS_CUDA_SIMT_FIBER_CONTEXT_H_

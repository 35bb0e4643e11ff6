// ThreadSanitizer annotations for Debian's absl::Mutex, linked into every program of the `tsan`
// build (ATTNSERVE_TSAN, see the top-level CMakeLists.txt).
//
// Why: Debian's Abseil is not compiled with -fsanitize=thread, so its Mutex (atomics and futexes
// inside libabsl_synchronization.so) is invisible to TSan, and every field our code guards with an
// absl::Mutex would be reported as a race. The linker's --wrap sends each call our code makes to
// the Mutex functions below to the __wrap_ function here, which calls the real one and tells TSan
// about the happens-before edge it creates: __tsan_acquire(mu) once the lock is held,
// __tsan_release(mu) before it is given up (Await and LockWhen may give it up and take it again
// inside, so they do both). A Condition is evaluated inside Abseil with the lock held, by the
// waiting thread or by whichever thread unlocks, so it is wrapped too: acquire before it reads our
// data, release after. TSan then checks our data as if Abseil were instrumented, except that it
// cannot report lock-order inversions on these mutexes.
//
// The symbol names are mangled by hand: CMake passes the prefix ATTNSERVE_ABSL_MUTEX_PREFIX
// ("_ZN4absl7debian35Mutex" for Debian 12's inline namespace) and --wrap's list of the names.
// The __real_ functions are weak so that a program that never uses absl::Mutex links without
// libabsl_synchronization.
#include <sanitizer/tsan_interface.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#ifndef ATTNSERVE_ABSL_MUTEX_PREFIX
#error "ATTNSERVE_ABSL_MUTEX_PREFIX must name the mangled prefix of absl::Mutex's members"
#endif

#define ATTNSERVE_REAL(suffix) __asm__("__real_" ATTNSERVE_ABSL_MUTEX_PREFIX suffix)
#define ATTNSERVE_WRAP(suffix) __asm__("__wrap_" ATTNSERVE_ABSL_MUTEX_PREFIX suffix)

namespace attnserve::tsan {

using absl::Condition;
using absl::Duration;
using absl::Mutex;
using absl::Time;

// The real members, called as free functions with the Mutex as first argument (the Itanium C++
// ABI passes `this` that way).
__attribute__((weak)) void RealLock(Mutex* mu) ATTNSERVE_REAL("4LockEv");
__attribute__((weak)) void RealUnlock(Mutex* mu) ATTNSERVE_REAL("6UnlockEv");
__attribute__((weak)) bool RealTryLock(Mutex* mu) ATTNSERVE_REAL("7TryLockEv");
__attribute__((weak)) void RealReaderLock(Mutex* mu) ATTNSERVE_REAL("10ReaderLockEv");
__attribute__((weak)) void RealReaderUnlock(Mutex* mu) ATTNSERVE_REAL("12ReaderUnlockEv");
__attribute__((weak)) bool RealReaderTryLock(Mutex* mu) ATTNSERVE_REAL("13ReaderTryLockEv");
__attribute__((weak)) void RealAwait(Mutex* mu, const Condition& cond)
    ATTNSERVE_REAL("5AwaitERKNS0_9ConditionE");
__attribute__((weak)) bool RealAwaitWithTimeout(Mutex* mu, const Condition& cond, Duration timeout)
    ATTNSERVE_REAL("16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
__attribute__((weak)) bool RealAwaitWithDeadline(Mutex* mu, const Condition& cond, Time deadline)
    ATTNSERVE_REAL("17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
__attribute__((weak)) void RealLockWhen(Mutex* mu, const Condition& cond)
    ATTNSERVE_REAL("8LockWhenERKNS0_9ConditionE");
__attribute__((weak)) bool RealLockWhenWithTimeout(Mutex* mu, const Condition& cond,
                                                   Duration timeout)
    ATTNSERVE_REAL("19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
__attribute__((weak)) bool RealLockWhenWithDeadline(Mutex* mu, const Condition& cond,
                                                    Time deadline)
    ATTNSERVE_REAL("20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");

namespace {

// `condition`, evaluated as TSan must see it: between an acquire and a release of `mu`.
class AnnotatedCondition {
 public:
  AnnotatedCondition(Mutex* mu, const Condition& condition) : mu_(mu), condition_(condition) {}

  Condition get() { return Condition(&AnnotatedCondition::Eval, this); }

 private:
  static bool Eval(AnnotatedCondition* self) {
    __tsan_acquire(self->mu_);
    const bool met = self->condition_.Eval();
    __tsan_release(self->mu_);
    return met;
  }

  Mutex* mu_;
  const Condition& condition_;
};

}  // namespace

void WrapLock(Mutex* mu) ATTNSERVE_WRAP("4LockEv");
void WrapLock(Mutex* mu) {
  RealLock(mu);
  __tsan_acquire(mu);
}

void WrapUnlock(Mutex* mu) ATTNSERVE_WRAP("6UnlockEv");
void WrapUnlock(Mutex* mu) {
  __tsan_release(mu);
  RealUnlock(mu);
}

bool WrapTryLock(Mutex* mu) ATTNSERVE_WRAP("7TryLockEv");
bool WrapTryLock(Mutex* mu) {
  const bool locked = RealTryLock(mu);
  if (locked) __tsan_acquire(mu);
  return locked;
}

void WrapReaderLock(Mutex* mu) ATTNSERVE_WRAP("10ReaderLockEv");
void WrapReaderLock(Mutex* mu) {
  RealReaderLock(mu);
  __tsan_acquire(mu);
}

void WrapReaderUnlock(Mutex* mu) ATTNSERVE_WRAP("12ReaderUnlockEv");
void WrapReaderUnlock(Mutex* mu) {
  __tsan_release(mu);
  RealReaderUnlock(mu);
}

bool WrapReaderTryLock(Mutex* mu) ATTNSERVE_WRAP("13ReaderTryLockEv");
bool WrapReaderTryLock(Mutex* mu) {
  const bool locked = RealReaderTryLock(mu);
  if (locked) __tsan_acquire(mu);
  return locked;
}

void WrapAwait(Mutex* mu, const Condition& cond) ATTNSERVE_WRAP("5AwaitERKNS0_9ConditionE");
void WrapAwait(Mutex* mu, const Condition& cond) {
  __tsan_release(mu);
  RealAwait(mu, AnnotatedCondition(mu, cond).get());
  __tsan_acquire(mu);
}

bool WrapAwaitWithTimeout(Mutex* mu, const Condition& cond, Duration timeout)
    ATTNSERVE_WRAP("16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
bool WrapAwaitWithTimeout(Mutex* mu, const Condition& cond, Duration timeout) {
  __tsan_release(mu);
  const bool met = RealAwaitWithTimeout(mu, AnnotatedCondition(mu, cond).get(), timeout);
  __tsan_acquire(mu);
  return met;
}

bool WrapAwaitWithDeadline(Mutex* mu, const Condition& cond, Time deadline)
    ATTNSERVE_WRAP("17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
bool WrapAwaitWithDeadline(Mutex* mu, const Condition& cond, Time deadline) {
  __tsan_release(mu);
  const bool met = RealAwaitWithDeadline(mu, AnnotatedCondition(mu, cond).get(), deadline);
  __tsan_acquire(mu);
  return met;
}

void WrapLockWhen(Mutex* mu, const Condition& cond) ATTNSERVE_WRAP("8LockWhenERKNS0_9ConditionE");
void WrapLockWhen(Mutex* mu, const Condition& cond) {
  RealLockWhen(mu, AnnotatedCondition(mu, cond).get());
  __tsan_acquire(mu);
}

bool WrapLockWhenWithTimeout(Mutex* mu, const Condition& cond, Duration timeout)
    ATTNSERVE_WRAP("19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
bool WrapLockWhenWithTimeout(Mutex* mu, const Condition& cond, Duration timeout) {
  const bool met = RealLockWhenWithTimeout(mu, AnnotatedCondition(mu, cond).get(), timeout);
  __tsan_acquire(mu);  // Held on return either way.
  return met;
}

bool WrapLockWhenWithDeadline(Mutex* mu, const Condition& cond, Time deadline)
    ATTNSERVE_WRAP("20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
bool WrapLockWhenWithDeadline(Mutex* mu, const Condition& cond, Time deadline) {
  const bool met = RealLockWhenWithDeadline(mu, AnnotatedCondition(mu, cond).get(), deadline);
  __tsan_acquire(mu);  // Held on return either way.
  return met;
}

}  // namespace attnserve::tsan

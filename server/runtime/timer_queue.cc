#include "server/runtime/timer_queue.h"

#include "absl/time/clock.h"

namespace attnserve::server {

TimerQueue::TimerQueue() : thread_([this] { Loop(); }) {}

TimerQueue::~TimerQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void TimerQueue::Schedule(absl::Time deadline, std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      timers_.emplace(std::make_pair(deadline, next_seq_++), std::move(callback));
      return;
    }
  }
  callback();
}

void TimerQueue::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (timers_.empty()) {
      if (stopping_) return;
      mu_.Await(absl::Condition(
          +[](TimerQueue* t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu_) {
            return t->stopping_ || !t->timers_.empty();
          },
          this));
      continue;
    }
    const absl::Time first = timers_.begin()->first.first;
    if (!stopping_ && absl::Now() < first) {
      // Wakes early on a new (possibly earlier) timer or on stop; the loop re-checks.
      const size_t size = timers_.size();
      struct Args {
        TimerQueue* self;
        size_t size;
      } args{this, size};
      mu_.AwaitWithDeadline(absl::Condition(
                                +[](Args* a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->self->mu_) {
                                  return a->self->stopping_ || a->self->timers_.size() != a->size;
                                },
                                &args),
                            first);
      continue;
    }
    std::function<void()> callback = std::move(timers_.begin()->second);
    timers_.erase(timers_.begin());
    mu_.Unlock();
    callback();
    callback = nullptr;
    mu_.Lock();
  }
}

}  // namespace attnserve::server

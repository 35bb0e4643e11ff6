// One thread that runs callbacks at deadlines: the scheduler's "wait at most max_queue_delay"
// without parking an executor thread (handlers and executor tasks never sleep).
#ifndef ATTNSERVE_SERVER_RUNTIME_TIMER_QUEUE_H_
#define ATTNSERVE_SERVER_RUNTIME_TIMER_QUEUE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attnserve::server {

class TimerQueue {
 public:
  TimerQueue();
  // Runs every callback still scheduled (early), then joins the thread.
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `callback` on the timer thread at `deadline` (at once if it has passed). Callbacks must
  // be short: they post work elsewhere (e.g. to a Strand). After destruction began,
  // `callback` runs immediately on the caller's thread.
  void Schedule(absl::Time deadline, std::function<void()> callback);

 private:
  void Loop();

  absl::Mutex mu_;
  // Ordered by deadline; the sequence number keeps equal deadlines in order.
  std::multimap<std::pair<absl::Time, uint64_t>, std::function<void()>> timers_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_TIMER_QUEUE_H_

// A fixed set of worker threads that run ParallelFor loops. The calling thread works too, so a
// pool of N threads runs N-way parallel with N-1 workers.
#ifndef ATTNSERVE_KERNELS_CPU_THREAD_POOL_H_
#define ATTNSERVE_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace attnserve {

class ThreadPool {
 public:
  // num_threads >= 1, the calling thread included.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs body(i) for every i in [0, count), spread over the threads; returns when all are done.
  // Thread-safe: concurrent callers (layers of different sessions) take turns, each loop getting
  // every thread. A body must not call ParallelFor on the same pool (it would wait for itself).
  void ParallelFor(int64_t count, const std::function<void(int64_t)>& body);

  // How long a worker that finished a loop, and a caller whose items are all taken, poll before
  // they block on the mutex. A decode step of a small batch is a few loops tens of microseconds
  // apart (q/k/v projection, attention, output projection, then the next layer's); a worker
  // that slept between them cost a futex wake-up and a scheduling delay per loop, as long as
  // the loop itself at batch 1. Longer gaps (a network round trip between layer calls) still
  // end asleep.
  static constexpr int64_t kSpinNanos = 50'000;

 private:
  void WorkerLoop();
  void RunShare();

  std::vector<std::thread> workers_;
  absl::Mutex loop_mu_;  // Held by the caller for a whole ParallelFor: one loop at a time.
  absl::Mutex mu_;
  const std::function<void(int64_t)>* body_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Written under mu_ only; read without it by the spin-waits, which then take mu_ and check
  // again, so they only decide when to look, never what is there.
  std::atomic<int64_t> pending_{0};  // Items not yet finished.
  std::atomic<uint64_t> posted_{0};  // generation_, or bumped once more when stopping.
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_THREAD_POOL_H_

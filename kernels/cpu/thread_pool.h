// A fixed set of worker threads that run ParallelFor loops. The calling thread works too, so a
// pool of N threads runs N-way parallel with N-1 workers.
#ifndef ATTNSERVE_KERNELS_CPU_THREAD_POOL_H_
#define ATTNSERVE_KERNELS_CPU_THREAD_POOL_H_

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

 private:
  void WorkerLoop();
  void RunShare();

  std::vector<std::thread> workers_;
  absl::Mutex loop_mu_;  // Held by the caller for a whole ParallelFor: one loop at a time.
  absl::Mutex mu_;
  const std::function<void(int64_t)>* body_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // Items not yet finished.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_THREAD_POOL_H_

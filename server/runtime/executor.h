// A small fixed-size thread pool that runs server work (engine calls, checkpoint loading) off the
// gRPC threads: gRPC callback handlers must never block, so they hand their work to an Executor
// and the task finishes the call.
#ifndef ATTNSERVE_SERVER_RUNTIME_EXECUTOR_H_
#define ATTNSERVE_SERVER_RUNTIME_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace attnserve::server {

class Executor {
 public:
  // num_threads >= 1.
  explicit Executor(int num_threads);
  // Runs every task already submitted, then joins the threads.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `task`; false (task dropped) once Shutdown has begun. Never blocks on running tasks.
  bool Submit(std::function<void()> task);

  // Stops accepting tasks, runs those queued, joins the threads. Idempotent.
  void Shutdown();

  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void WorkerLoop();

  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_EXECUTOR_H_

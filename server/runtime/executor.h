// A small fixed-size thread pool that runs server work (engine calls, checkpoint loading) off the
// gRPC threads: gRPC callback handlers must never block, so they hand their work to an Executor
// and the task finishes the call. A Strand runs tasks on it one at a time, in order.
#ifndef ATTNSERVE_SERVER_RUNTIME_EXECUTOR_H_
#define ATTNSERVE_SERVER_RUNTIME_EXECUTOR_H_

#include <deque>
#include <functional>
#include <memory>
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

// Runs tasks one at a time, in the order they were posted, on an Executor.
//
// Each session owns one. The engine's layers must not be called concurrently, and one request's
// steps must apply in arrival order; posting every call on a session to its strand gives both
// without making an executor thread wait on a lock (a busy session never occupies more than one
// executor thread, so other sessions keep running).
//
// Always held by shared_ptr: a running drain keeps the strand alive even when the task it runs
// drops the last reference to the strand's owner.
class Strand : public std::enable_shared_from_this<Strand> {
 public:
  static std::shared_ptr<Strand> Create(Executor* executor);

  // Queues `task` behind every task posted before it. False when the executor refused it
  // (shutting down); the task is then dropped.
  bool Post(std::function<void()> task);

 private:
  explicit Strand(Executor* executor) : executor_(executor) {}
  // Runs one task, then schedules itself again if more are queued (one task per executor turn,
  // so sessions share the executor fairly).
  void RunOne();

  Executor* const executor_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool scheduled_ ABSL_GUARDED_BY(mu_) = false;  // A RunOne is queued on or running in executor_.
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_EXECUTOR_H_

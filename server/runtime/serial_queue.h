// Runs tasks one at a time, in the order they were posted, on an Executor: a "strand".
//
// Each session owns one. The engine's layers must not be called concurrently, and one request's
// steps must apply in arrival order; posting every call on a session to its queue gives both
// without making an executor thread wait on a lock (a busy session never occupies more than one
// executor thread, so other sessions keep running).
#ifndef ATTNSERVE_SERVER_RUNTIME_SERIAL_QUEUE_H_
#define ATTNSERVE_SERVER_RUNTIME_SERIAL_QUEUE_H_

#include <deque>
#include <functional>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "server/runtime/executor.h"

namespace attnserve::server {

// Always held by shared_ptr: a running drain keeps the queue alive even when the task it runs
// drops the last reference to the queue's owner.
class SerialQueue : public std::enable_shared_from_this<SerialQueue> {
 public:
  static std::shared_ptr<SerialQueue> Create(Executor* executor);

  // Queues `task` behind every task posted before it. False when the executor refused it
  // (shutting down); the task is then dropped.
  bool Post(std::function<void()> task);

 private:
  explicit SerialQueue(Executor* executor) : executor_(executor) {}
  // Runs one task, then schedules itself again if more are queued (one task per executor turn,
  // so sessions share the executor fairly).
  void RunOne();

  Executor* const executor_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool scheduled_ ABSL_GUARDED_BY(mu_) = false;  // A RunOne is queued on or running in executor_.
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_SERIAL_QUEUE_H_

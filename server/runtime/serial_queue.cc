#include "server/runtime/serial_queue.h"

#include <cstdio>
#include <new>
#include <utility>

namespace attnserve::server {

std::shared_ptr<SerialQueue> SerialQueue::Create(Executor* executor) {
  return std::shared_ptr<SerialQueue>(new SerialQueue(executor));
}

bool SerialQueue::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
    if (scheduled_) return true;
    scheduled_ = true;
  }
  if (executor_->Submit([self = shared_from_this()] { self->RunOne(); })) return true;
  absl::MutexLock lock(&mu_);
  tasks_.clear();
  scheduled_ = false;
  return false;
}

void SerialQueue::RunOne() {
  std::function<void()> task;
  {
    absl::MutexLock lock(&mu_);
    task = std::move(tasks_.front());
    tasks_.pop_front();
  }
  // The last line of defence (the calls' own work catches std::bad_alloc where it can answer the
  // call): a task that runs out of memory must not end the process nor stall the queue.
  try {
    task();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "attnserve: a session task ran out of memory (std::bad_alloc); its call "
                         "may go unanswered until its deadline\n");
  }
  task = nullptr;  // Release the task's captures before possibly rescheduling.
  {
    absl::MutexLock lock(&mu_);
    if (tasks_.empty()) {
      scheduled_ = false;
      return;
    }
  }
  if (!executor_->Submit([self = shared_from_this()] { self->RunOne(); })) {
    absl::MutexLock lock(&mu_);
    tasks_.clear();
    scheduled_ = false;
  }
}

}  // namespace attnserve::server

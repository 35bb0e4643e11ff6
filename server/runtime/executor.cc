#include "server/runtime/executor.h"

#include <cstdio>
#include <new>
#include <utility>

namespace attnserve::server {

Executor::Executor(int num_threads) {
  if (num_threads < 1) num_threads = 1;
  threads_.reserve(static_cast<size_t>(num_threads));
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

Executor::~Executor() { Shutdown(); }

bool Executor::Submit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  return true;
}

void Executor::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void Executor::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Executor* e)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_ || !e->tasks_.empty(); },
          this));
      // Drain before exiting: a queued task may be the one that finishes a gRPC call.
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    try {
      task();
    } catch (const std::bad_alloc&) {
      // See Strand::RunOne: no allocation failure ends the process.
      std::fprintf(stderr, "attnserve: an executor task ran out of memory (std::bad_alloc); its "
                           "call may go unanswered until its deadline\n");
    }
  }
}

std::shared_ptr<Strand> Strand::Create(Executor* executor) {
  return std::shared_ptr<Strand>(new Strand(executor));
}

bool Strand::Post(std::function<void()> task) {
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

void Strand::RunOne() {
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

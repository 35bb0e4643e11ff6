#include "kernels/cpu/thread_pool.h"

namespace attnserve {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

// Takes items one at a time until none are left. Items are coarse (a head, a page range), so a
// lock per item costs nothing measurable and keeps the balancing exact.
void ThreadPool::RunShare() {
  mu_.Lock();
  while (body_ != nullptr && next_ < count_) {
    const int64_t item = next_++;
    const auto* body = body_;
    mu_.Unlock();
    (*body)(item);
    mu_.Lock();
    --pending_;
  }
  mu_.Unlock();
}

void ThreadPool::WorkerLoop() {
  uint64_t seen_generation = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || (generation_ != seen_generation && body_ != nullptr && next_ < count_);
      };
      mu_.Await(absl::Condition(&has_work));
      if (stopping_) return;
      seen_generation = generation_;
    }
    RunShare();
  }
}

void ThreadPool::ParallelFor(int64_t count, const std::function<void(int64_t)>& body) {
  if (count <= 0) return;
  absl::MutexLock loop_lock(&loop_mu_);
  if (workers_.empty() || count == 1) {
    for (int64_t i = 0; i < count; ++i) body(i);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    body_ = &body;
    count_ = count;
    next_ = 0;
    pending_ = count;
    ++generation_;
  }
  RunShare();
  absl::MutexLock lock(&mu_);
  auto all_done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  mu_.Await(absl::Condition(&all_done));
  body_ = nullptr;
}

}  // namespace attnserve

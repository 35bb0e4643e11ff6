#include "kernels/cpu/thread_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace attnserve {

namespace {
// How long a thread spins before sleeping: about what a futex wake-up costs on the VMs we measure
// on (docs/benchmarks.md, "The server's part of a layer call"), and longer than the serial work
// between the fan-outs of one decode step, so a step's loops find the worker awake.
constexpr std::chrono::microseconds kSpin{50};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}
}  // namespace

template <typename Done>
bool ThreadPool::SpinUntil(const Done& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  while (!done()) {
    for (int i = 0; i < 16; ++i) CpuRelax();
    if (std::chrono::steady_clock::now() > deadline) return done();
  }
  return true;
}

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    posted_.fetch_add(1, std::memory_order_release);
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
    unfinished_.store(pending_, std::memory_order_release);
  }
  mu_.Unlock();
}

void ThreadPool::WorkerLoop() {
  uint64_t seen_generation = 0;
  uint64_t seen_posted = 0;
  while (true) {
    // A new loop, or stopping, changes posted_; sleep only when none came within the spin.
    const bool posted =
        SpinUntil([&] { return posted_.load(std::memory_order_acquire) != seen_posted; });
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || (generation_ != seen_generation && body_ != nullptr && next_ < count_);
      };
      if (!posted) mu_.Await(absl::Condition(&has_work));
      if (stopping_) return;
      seen_posted = posted_.load(std::memory_order_relaxed);
      if (!has_work()) continue;  // The caller took the whole loop: spin for the next one.
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
    unfinished_.store(count, std::memory_order_relaxed);
    posted_.fetch_add(1, std::memory_order_release);
  }
  RunShare();
  SpinUntil([this] { return unfinished_.load(std::memory_order_acquire) == 0; });
  absl::MutexLock lock(&mu_);
  auto all_done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  mu_.Await(absl::Condition(&all_done));
  body_ = nullptr;
}

}  // namespace attnserve

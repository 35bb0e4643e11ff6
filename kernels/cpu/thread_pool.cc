#include "kernels/cpu/thread_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace attnserve {

namespace {
// Polls done() for up to ThreadPool::kSpinNanos; true once it held. Between polls the thread
// pauses (a few tens of cycles) and yields, so on a core other processes want the spin gives the
// core up rather than holding it for the whole time.
template <typename Done>
bool SpinUntil(const Done& done) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(ThreadPool::kSpinNanos);
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::yield();
  }
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    posted_.fetch_add(1, std::memory_order_release);  // Ends the workers' spins.
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
    pending_.fetch_sub(1, std::memory_order_release);
  }
  mu_.Unlock();
}

void ThreadPool::WorkerLoop() {
  uint64_t seen_generation = 0;
  while (true) {
    // The next loop usually comes within the spin; the mutex wait below then finds it at once.
    SpinUntil([&] { return posted_.load(std::memory_order_acquire) != seen_generation; });
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
    pending_.store(count, std::memory_order_relaxed);
    ++generation_;
    posted_.store(generation_, std::memory_order_release);
  }
  RunShare();
  // The workers' last items are usually a few microseconds from done.
  SpinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; });
  absl::MutexLock lock(&mu_);
  auto all_done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return pending_.load(std::memory_order_relaxed) == 0;
  };
  mu_.Await(absl::Condition(&all_done));
  body_ = nullptr;
}

}  // namespace attnserve

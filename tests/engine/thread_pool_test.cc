// The CPU backend's thread pool: every index runs exactly once, and loops started from several
// threads at once (layers of different sessions share one backend) do not mix.
#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(ThreadPoolTest, RunsEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t count : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
    pool.ParallelFor(count, [&](int64_t i) { hits[i].fetch_add(1); });
    for (int64_t i = 0; i < count; ++i) EXPECT_EQ(hits[i].load(), 1) << "count " << count;
  }
}

TEST(ThreadPoolTest, ConcurrentCallersEachGetTheirOwnLoop) {
  ThreadPool pool(2);
  constexpr int kCallers = 6;
  constexpr int kRounds = 200;
  std::vector<int64_t> totals(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < kRounds; ++round) {
        std::atomic<int64_t> sum{0};
        pool.ParallelFor(50, [&](int64_t i) { sum.fetch_add(i + c); });
        totals[c] += sum.load();
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(totals[c], int64_t{kRounds} * (49 * 50 / 2 + 50 * c)) << "caller " << c;
  }
}

}  // namespace
}  // namespace attnserve

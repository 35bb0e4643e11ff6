// A server counter read all along by a thread of the test, each read with the times (on the
// test's clock) its call was sent and answered. With them a test says how many increments
// certainly happened between two of its own events (e.g. the send and the answer of a step): an
// order from the server's own account, not a bound in milliseconds that a loaded machine breaks.
#ifndef ATTNSERVE_TESTS_SUPPORT_COUNTER_READS_H_
#define ATTNSERVE_TESTS_SUPPORT_COUNTER_READS_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace attnserve::server_test {

class CounterReads {
 public:
  using Clock = std::chrono::steady_clock;

  // Reads `read` (the counter now, or an error, which ends the reads) about every `pace` from
  // now until Stop. Times are nanoseconds since `t0`.
  CounterReads(std::function<absl::StatusOr<int64_t>()> read, Clock::time_point t0,
               std::chrono::microseconds pace = std::chrono::milliseconds(1))
      : t0_(t0), thread_([this, read = std::move(read), pace] {
          while (!stop_.load()) {
            const int64_t sent = NowNs();
            absl::StatusOr<int64_t> value = read();
            if (!value.ok()) {
              failure_ = value.status().ToString();
              return;
            }
            reads_.push_back({sent, NowNs(), *value});
            // Pacing only: fine-grained against what the counter counts, and leaves the cores
            // to the server.
            std::this_thread::sleep_for(pace);
          }
        }) {}
  ~CounterReads() { Stop(); }
  CounterReads(const CounterReads&) = delete;
  CounterReads& operator=(const CounterReads&) = delete;

  // Ends the reads; the accessors below are for after it.
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  // The increments that certainly happened between `begin_ns` and `end_ns`: the value of the
  // last read answered by `end_ns` less that of the first read sent at or after `begin_ns` (0
  // when there is no such pair).
  int64_t CertainlyBetween(int64_t begin_ns, int64_t end_ns) const {
    const Read* first = nullptr;
    const Read* last = nullptr;
    for (const Read& read : reads_) {
      if (first == nullptr && read.sent_ns >= begin_ns) first = &read;
      if (read.answered_ns <= end_ns) last = &read;
    }
    if (first == nullptr || last == nullptr) return 0;
    return std::max<int64_t>(0, last->value - first->value);
  }

  // How many distinct values the reads saw in a row: that they saw the counter move step by step.
  int64_t DistinctValues() const {
    int64_t n = 0;
    for (size_t i = 0; i < reads_.size(); ++i) {
      n += i == 0 || reads_[i].value != reads_[i - 1].value ? 1 : 0;
    }
    return n;
  }

  size_t size() const { return reads_.size(); }
  // Empty, or the error that ended the reads.
  const std::string& failure() const { return failure_; }

 private:
  struct Read {
    int64_t sent_ns, answered_ns, value;
  };

  int64_t NowNs() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count();
  }

  const Clock::time_point t0_;
  std::atomic<bool> stop_{false};
  std::vector<Read> reads_;  // The thread's until Stop.
  std::string failure_;      // The thread's until Stop.
  std::thread thread_;       // Last: starts once the members above exist.
};

}  // namespace attnserve::server_test

#endif  // ATTNSERVE_TESTS_SUPPORT_COUNTER_READS_H_

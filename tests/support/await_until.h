// The tests' one way to wait for an event of another process or thread: poll a predicate until it
// holds or a bound passes. The bound keeps a test from hanging when the event never comes; the
// predicate is evaluated one last time at the bound, so a slow machine's late event still counts.
#ifndef ATTNSERVE_TESTS_SUPPORT_AWAIT_UNTIL_H_
#define ATTNSERVE_TESTS_SUPPORT_AWAIT_UNTIL_H_

#include <chrono>
#include <thread>

namespace attnserve {

inline constexpr std::chrono::milliseconds kAwaitPoll{10};

// Calls `predicate` every `poll` until it returns true (then true) or `timeout` has passed since
// the call (then false, after a last try).
template <typename Predicate>
bool AwaitUntil(Predicate&& predicate, std::chrono::milliseconds timeout,
                std::chrono::milliseconds poll = kAwaitPoll) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() >= give_up) return predicate();
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace attnserve

#endif  // ATTNSERVE_TESTS_SUPPORT_AWAIT_UNTIL_H_

// A session's cut for a drain (server/fleet/drain.h): once sealed, every call that would change
// its requests is refused UNAVAILABLE instead of applied, because the drain has listed the requests
// it moves and a change made here afterwards would never reach the peer (issue 21, items 5 and 6:
// a Forward queued at SIGTERM, or an ImportRequest whose pages came after it, answered OK for a
// request the peer never received). The drain seals a session in its turn on the session's queue,
// so the calls queued before it finish first and are moved with it.
#ifndef ATTNSERVE_SERVER_SESSION_DRAIN_SEAL_H_
#define ATTNSERVE_SERVER_SESSION_DRAIN_SEAL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace attnserve::server {

class DrainSeal {
 public:
  // Called with the number of requests a refused call named (for the drain's log and metric).
  using RefusalObserver = std::function<void(int64_t requests)>;

  // From now on Check fails with UNAVAILABLE `message`. Any thread; the first seal wins.
  void Seal(std::string message, RefusalObserver on_refused) ABSL_LOCKS_EXCLUDED(mu_);
  bool sealed() const { return sealed_.load(std::memory_order_acquire); }

  // OK while unsealed; once sealed, UNAVAILABLE with the seal's message, counting the call's
  // `requests` as refused.
  absl::Status Check(int64_t requests) ABSL_LOCKS_EXCLUDED(mu_);

  // Requests of the calls refused since the seal.
  int64_t refused_requests() const { return refused_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> sealed_{false};
  std::atomic<int64_t> refused_{0};
  mutable absl::Mutex mu_;
  std::string message_ ABSL_GUARDED_BY(mu_);
  RefusalObserver on_refused_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_DRAIN_SEAL_H_

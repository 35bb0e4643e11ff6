// A background thread that frees idle requests (request_ttl) and idle sessions (session_ttl).
//
// It only decides what expired; the freeing itself is posted on each session's Strand, so it
// never races with a step of the same session.
#ifndef ATTNSERVE_SERVER_SESSION_TTL_SWEEPER_H_
#define ATTNSERVE_SERVER_SESSION_TTL_SWEEPER_H_

#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/observability/metrics.h"
#include "server/session/registry.h"

namespace attnserve::server {

class TtlSweeper {
 public:
  // Checks every `period`; a TTL of zero or less disables that kind of expiry. Expiries are
  // counted in `metrics` (attnserve_expired_total) when it is not null; it must outlive this.
  TtlSweeper(SessionRegistry* registry, absl::Duration request_ttl, absl::Duration session_ttl,
             absl::Duration period, Metrics* metrics = nullptr);
  ~TtlSweeper();  // Stops and joins.

  void Stop();

  // One pass (also called by the thread). Public for tests.
  void SweepOnce(absl::Time now);

 private:
  void Loop();

  SessionRegistry* const registry_;
  Metrics* const metrics_;
  const absl::Duration request_ttl_;
  const absl::Duration session_ttl_;
  const absl::Duration period_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// How often to sweep: a quarter of the shorter TTL, between 50 ms and 10 s, so expiry happens
// within about 25% of the TTL.
absl::Duration SweepPeriod(absl::Duration request_ttl, absl::Duration session_ttl);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_TTL_SWEEPER_H_

#include "server/session/ttl_sweeper.h"

#include <algorithm>
#include <memory>

#include "absl/time/clock.h"
#include "server/observability/logging.h"

namespace attnserve::server {

absl::Duration SweepPeriod(absl::Duration request_ttl, absl::Duration session_ttl) {
  absl::Duration shortest = absl::InfiniteDuration();
  if (request_ttl > absl::ZeroDuration()) shortest = std::min(shortest, request_ttl);
  if (session_ttl > absl::ZeroDuration()) shortest = std::min(shortest, session_ttl);
  return std::clamp(shortest / 4, absl::Milliseconds(50), absl::Seconds(10));
}

TtlSweeper::TtlSweeper(SessionRegistry* registry, absl::Duration request_ttl,
                       absl::Duration session_ttl, absl::Duration period, Metrics* metrics)
    : registry_(registry),
      metrics_(metrics),
      request_ttl_(request_ttl),
      session_ttl_(session_ttl),
      period_(period),
      thread_([this] { Loop(); }) {}

TtlSweeper::~TtlSweeper() { Stop(); }

void TtlSweeper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void TtlSweeper::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Sleeps for `period_` unless Stop() flips stopping_.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_);
    if (stopping_) break;
    mu_.Unlock();
    SweepOnce(absl::Now());
    mu_.Lock();
  }
}

void TtlSweeper::SweepOnce(absl::Time now) {
  for (const std::shared_ptr<Session>& session : registry_->All()) {
    if (session_ttl_ > absl::ZeroDuration() && session->IdleTime(now) > session_ttl_) {
      if (std::shared_ptr<Session> removed = registry_->Remove(session)) {
        removed->queue().Post([removed, metrics = metrics_] {
          const int64_t freed = removed->Close();
          if (metrics != nullptr) {
            metrics->CountExpired(removed->variant_label(), ExpiryKind::kSession, 1);
          }
          SERVER_LOG(INFO, "session %s expired after session_ttl; freed %d KV bytes", removed->id(),
                     freed);
        });
      }
      continue;
    }
    if (request_ttl_ > absl::ZeroDuration()) {
      session->queue().Post([session, now, ttl = request_ttl_, metrics = metrics_] {
        const int expired = session->ExpireRequests(now, ttl);
        if (expired > 0 && metrics != nullptr) {
          metrics->CountExpired(session->variant_label(), ExpiryKind::kRequest, expired);
        }
        if (expired > 0) {
          SERVER_LOG(INFO, "session %s: %d requests expired after request_ttl", session->id(),
                     expired);
        }
      });
    }
  }
}

}  // namespace attnserve::server

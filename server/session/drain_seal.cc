#include "server/session/drain_seal.h"

#include <utility>

namespace attnserve::server {

void DrainSeal::Seal(std::string message, RefusalObserver on_refused) {
  absl::MutexLock lock(&mu_);
  if (sealed_.load(std::memory_order_relaxed)) return;
  message_ = std::move(message);
  on_refused_ = std::move(on_refused);
  sealed_.store(true, std::memory_order_release);
}

absl::Status DrainSeal::Check(int64_t requests) {
  if (!sealed()) return absl::OkStatus();
  refused_.fetch_add(requests, std::memory_order_relaxed);
  RefusalObserver observer;
  std::string message;
  {
    absl::MutexLock lock(&mu_);
    observer = on_refused_;
    message = message_;
  }
  if (observer) observer(requests);
  return absl::UnavailableError(std::move(message));
}

}  // namespace attnserve::server

#include "server/rpc/call_tracker.h"

#include <utility>

namespace attnserve::server {

// Lives as long as its call (gRPC deletes a call's interceptors with the call's context).
class CallTracker::Interceptor final : public grpc::experimental::Interceptor {
 public:
  explicit Interceptor(CallTracker* tracker) : tracker_(tracker), number_(tracker->Started()) {}
  ~Interceptor() override { tracker_->Ended(number_); }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  CallTracker* const tracker_;
  const uint64_t number_;
};

class CallTracker::Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(CallTracker* tracker) : tracker_(tracker) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* /*info*/) override {
    return new Interceptor(tracker_);
  }

 private:
  CallTracker* const tracker_;
};

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CallTracker::NewInterceptorFactory() {
  return std::make_unique<Factory>(this);
}

uint64_t CallTracker::Started() {
  absl::MutexLock lock(&mu_);
  ++live_;
  return next_number_++;
}

void CallTracker::Ended(uint64_t number) {
  absl::MutexLock lock(&mu_);
  --live_;
  if (number < cut_) --live_before_cut_;
}

int64_t CallTracker::live() const {
  absl::MutexLock lock(&mu_);
  return live_;
}

bool CallTracker::AwaitCallsStartedBefore(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  // Every live call started before now: a later cut only adds the ones since the previous one.
  if (next_number_ > cut_) {
    live_before_cut_ = live_;
    cut_ = next_number_;
  }
  const auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_before_cut_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&ended), deadline);
}

}  // namespace attnserve::server

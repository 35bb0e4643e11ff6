#include "server/rpc/wire_call.h"

#include <new>
#include <vector>

#include "absl/strings/str_cat.h"

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

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status CheckIdLength(const std::string& id, absl::string_view field, size_t max_bytes) {
  if (id.size() <= max_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": has ", id.size(), " bytes, at most ", max_bytes, " allowed"));
}

absl::Status CheckId(const std::string& id, absl::string_view field, size_t max_bytes) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  return CheckIdLength(id, field, max_bytes);
}

void ObserveCall(Metrics& metrics, Rpc rpc, const std::string& variant, const grpc::Status& status,
                 const RpcTiming& timing) {
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  metrics.ObserveRpc(rpc, variant, code, timing);
  if (code == absl::StatusCode::kResourceExhausted &&
      IsKvExhaustion(absl::Status(code, status.error_message()))) {
    metrics.CountKvRejection(variant);
  }
}

bool ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  message->Clear();
  // The common case, one slice, parsed in place: no vector of slices per message (a decode
  // stream parses one message per layer per step).
  if (grpc::Slice single; buffer.TrySingleSlice(&single).ok()) {
    return message->ParseFromArray(single.begin(), static_cast<int>(single.size()));
  }
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  if (slices.size() == 1) {
    return message->ParseFromArray(slices[0].begin(), static_cast<int>(slices[0].size()));
  }
  // Rare (large messages arrive in several slices): join them once.
  try {
    std::string joined;
    joined.reserve(buffer.Length());
    for (const grpc::Slice& slice : slices) {
      joined.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    return message->ParseFromString(joined);
  } catch (const std::bad_alloc&) {
    // Out of memory: answered as unparseable (the message is dropped), not an ended process.
    message->Clear();
    return false;
  }
}

grpc::Status UnparseableMessage(const google::protobuf::Message& message, size_t num_bytes) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("request is not a valid ", message.GetTypeName(), " (",
                                   num_bytes, " bytes could not be parsed)"));
}

grpc::Status MissingMessage(const google::protobuf::Message& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("the stream ended before its ", message.GetTypeName(),
                                   " request message"));
}

grpc::Status CheckResponseSize(size_t size, int64_t max_bytes) {
  if (static_cast<int64_t>(size) <= max_bytes) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("the response is ", size,
                                   " bytes, over the server's max_message_bytes = ", max_bytes));
}

grpc::Status ResponseNotAllocated(size_t size) {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("out of memory: the response of ", size,
                                   " bytes could not be allocated"));
}

grpc::Status SerializeMessage(const google::protobuf::Message& message, int64_t max_bytes,
                              grpc::ByteBuffer* buffer) {
  const size_t size = message.ByteSizeLong();
  if (grpc::Status fits = CheckResponseSize(size, max_bytes); !fits.ok()) return fits;
  // Allocated here rather than by gRPC (grpc::Slice(size) aborts the process when malloc fails):
  // a response the process cannot hold fails its call alone.
  uint8_t* data = nullptr;
  try {
    data = new uint8_t[size == 0 ? 1 : size];
  } catch (const std::bad_alloc&) {
    return ResponseNotAllocated(size);
  }
  message.SerializeWithCachedSizesToArray(data);
  grpc::Slice slice(data, size, [](void* p) { delete[] static_cast<uint8_t*>(p); });
  grpc::ByteBuffer serialized(&slice, 1);
  buffer->Swap(&serialized);
  return grpc::Status::OK;
}

}  // namespace attnserve::server

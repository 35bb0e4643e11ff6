#include "client/common/session_routing.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "kernels/base/random_id.h"

namespace attnserve {

namespace {

constexpr absl::string_view kServicePrefix = "/attnserve.v1.AttentionService/";
constexpr absl::string_view kConfigureMethod = "/attnserve.v1.AttentionService/Configure";

// The `session_id` string field of a request, "" when it has none.
std::string SessionIdOf(const google::protobuf::Message& request) {
  const google::protobuf::FieldDescriptor* field =
      request.GetDescriptor()->FindFieldByName("session_id");
  if (field == nullptr || field->type() != google::protobuf::FieldDescriptor::TYPE_STRING ||
      field->is_repeated()) {
    return "";
  }
  return request.GetReflection()->GetString(request, field);
}

class SessionRoutingInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit SessionRoutingInterceptor(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    // A unary call sends its metadata and its one message in the same batch; a stream's first
    // batch has no message (its caller tagged it).
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA) &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      auto* metadata = methods->GetSendInitialMetadata();
      if (metadata->find(kSessionMetadataKey) == metadata->end()) {
        std::string id;
        if (method_ == kConfigureMethod) {
          id = NewClientSessionId();
        } else if (const void* message = methods->GetSendMessage(); message != nullptr) {
          // Every AttentionService stub sends generated protobuf messages.
          id = SessionIdOf(*static_cast<const google::protobuf::Message*>(message));
        }
        if (!id.empty()) metadata->emplace(kSessionMetadataKey, std::move(id));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
};

class SessionRoutingInterceptorFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    const absl::string_view method = info->method() == nullptr ? "" : info->method();
    // Only the typed stubs of our service: other calls (the health check's raw bytes) are not
    // protobuf messages to read, and carry no session.
    if (!absl::StartsWith(method, kServicePrefix) ||
        info->type() != grpc::experimental::ClientRpcInfo::Type::UNARY) {
      return nullptr;
    }
    return new SessionRoutingInterceptor(std::string(method));
  }
};

}  // namespace

std::string NewClientSessionId() { return RandomHexId128(); }

void AddSessionMetadata(grpc::ClientContext* context, const std::string& session_id) {
  if (!session_id.empty()) context->AddMetadata(kSessionMetadataKey, session_id);
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
MakeSessionRoutingInterceptorFactory() {
  return std::make_unique<SessionRoutingInterceptorFactory>();
}

}  // namespace attnserve

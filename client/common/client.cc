#include "client/common/client.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/common/status_names.h"
#include "proto/codec/tensor_codec.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"

namespace attnserve {

void Client::Prepare(grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

grpc::Status CallRelease(const Client& client, const std::string& session_id,
                         const std::string& request_id, v1::ReleaseResponse* response) {
  v1::ReleaseRequest request;
  request.set_session_id(session_id);
  request.set_request_id(request_id);
  v1::ReleaseResponse unused;
  grpc::ClientContext context;
  client.Prepare(&context);
  return client.stub->Release(&context, request, response != nullptr ? response : &unused);
}

v1::DecodeItem* AddRandomDecodeItem(v1::DecodeRequest* request, const std::string& request_id,
                                    std::mt19937_64& rng, int64_t d_model, DType dtype) {
  v1::DecodeItem* item = request->add_items();
  item->set_request_id(request_id);
  TensorToProto(RandomHidden(rng, 1, d_model, dtype), item->mutable_hidden());
  return item;
}

grpc::Status CallGetSession(const Client& client, const std::string& session_id,
                            v1::GetSessionResponse* response) {
  v1::GetSessionRequest request;
  request.set_session_id(session_id);
  grpc::ClientContext context;
  client.Prepare(&context);
  return client.stub->GetSession(&context, request, response);
}

Client MakeClient(const std::string& target, absl::Duration timeout, bool json,
                  const ChannelSecurity& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  Client client;
  client.target = target;
  client.channel = CreateSecureChannel(target, security, args);
  client.stub = v1::AttentionService::NewStub(client.channel);
  client.timeout = timeout;
  client.json = json;
  return client;
}

int ReportRpcError(absl::string_view what, const grpc::Status& status) {
  std::fprintf(stderr, "attnctl: %s failed: %s\n", std::string(what).c_str(),
               GrpcStatusString(status).c_str());
  return kExitRpcError;
}

int ReportError(absl::string_view message, int exit_code) {
  std::fprintf(stderr, "attnctl: %s\n", std::string(message).c_str());
  return exit_code;
}

Tensor RandomHidden(std::mt19937_64& rng, int64_t rows, int64_t d_model, DType dtype) {
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<size_t>(rows * d_model));
  for (float& value : values) value = normal(rng);
  Tensor tensor = Tensor::FromFloats({rows, d_model}, values);
  return dtype == DType::kF32 ? tensor : tensor.CastTo(dtype);
}

double Rms(const Tensor& tensor) {
  const std::vector<float> values = tensor.ToFloats();
  if (values.empty()) return 0.0;
  double sum = 0;
  for (float value : values) sum += static_cast<double>(value) * value;
  return std::sqrt(sum / values.size());
}

namespace {

// Field 1 (string service) of grpc.health.v1.HealthCheckRequest.
std::string EncodeHealthRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;
  out.push_back(0x0a);  // field 1, wire type 2 (length-delimited)
  size_t length = service.size();
  while (length >= 0x80) {
    out.push_back(static_cast<char>((length & 0x7f) | 0x80));
    length >>= 7;
  }
  out.push_back(static_cast<char>(length));
  out += service;
  return out;
}

// Field 1 (enum ServingStatus status) of grpc.health.v1.HealthCheckResponse; absent = 0.
int DecodeHealthStatus(const std::string& bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t key = static_cast<uint8_t>(bytes[i++]);
    uint64_t value = 0;
    int shift = 0;
    if ((key & 7) != 0) return -1;  // Only varint fields are expected.
    while (i < bytes.size()) {
      const uint8_t byte = static_cast<uint8_t>(bytes[i++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      shift += 7;
      if ((byte & 0x80) == 0) break;
    }
    if ((key >> 3) == 1) return static_cast<int>(value);
  }
  return 0;
}

}  // namespace

grpc::Status CheckHealth(const Client& client, const std::string& service,
                         std::string* serving_status) {
  const std::string request_bytes = EncodeHealthRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  client.Prepare(&context);
  const grpc::internal::RpcMethod method("/grpc.health.v1.Health/Check",
                                         grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      client.channel.get(), method, &context, request, &response);
  if (!status.ok()) return status;
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  switch (DecodeHealthStatus(bytes)) {
    case 1:
      *serving_status = "SERVING";
      break;
    case 2:
      *serving_status = "NOT_SERVING";
      break;
    case 3:
      *serving_status = "SERVICE_UNKNOWN";
      break;
    default:
      *serving_status = "UNKNOWN";
      break;
  }
  return grpc::Status::OK;
}

double NanosToMillis(int64_t nanos) { return static_cast<double>(nanos) / 1e6; }

}  // namespace attnserve

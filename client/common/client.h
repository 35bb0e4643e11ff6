// What attnctl's subcommands share: the channel and stub, per-call deadlines, error reporting,
// random hidden states and the grpc.health.v1 check.
#ifndef ATTNSERVE_CLIENT_COMMON_CLIENT_H_
#define ATTNSERVE_CLIENT_COMMON_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention_service.grpc.pb.h"
#include "client/common/channel_security.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "kernels/core/tensor.h"

namespace attnserve {

// Exit codes of attnctl.
inline constexpr int kExitOk = 0;
inline constexpr int kExitRpcError = 1;  // The server answered an error (or could not be reached).
inline constexpr int kExitUsage = 2;     // Bad flags or unreadable input files.

struct Client {
  std::string target;  // "127.0.0.1:50051"
  std::shared_ptr<grpc::Channel> channel;
  std::shared_ptr<v1::AttentionService::Stub> stub;
  absl::Duration timeout =
      absl::Seconds(60);  // Deadline of each call (a whole stream for streams).
  bool json = false;
  // The server's max_message_bytes once CallForward has asked (0 = not yet): shared by copies.
  std::shared_ptr<std::atomic<int64_t>> server_max_message_bytes =
      std::make_shared<std::atomic<int64_t>>(0);

  // Sets the deadline of `context` to now + timeout.
  void Prepare(grpc::ClientContext* context) const;
};

// A channel to `target` that accepts messages up to 1 GiB (the server enforces its own limit; the
// client should not be the one to reject a large output); plaintext, TLS and a bearer token as
// `security` says (client/common/channel_security.h).
Client MakeClient(const std::string& target, absl::Duration timeout, bool json,
                  const ChannelSecurity& security = {});

// Release of `session_id` (only its request `request_id` when not empty) and GetSession, each
// with the deadline Prepare sets.
grpc::Status CallRelease(const Client& client, const std::string& session_id,
                         const std::string& request_id = "",
                         v1::ReleaseResponse* response = nullptr);
grpc::Status CallGetSession(const Client& client, const std::string& session_id,
                            v1::GetSessionResponse* response);

// Prints "attnctl: <what> failed: <CODE>: <message>" to stderr and returns kExitRpcError.
int ReportRpcError(absl::string_view what, const grpc::Status& status);
// Prints "attnctl: <message>" to stderr and returns `exit_code`.
int ReportError(absl::string_view message, int exit_code = kExitUsage);

// [rows, d_model] of N(0, 1) samples drawn from `rng`, stored as `dtype`.
Tensor RandomHidden(std::mt19937_64& rng, int64_t rows, int64_t d_model, DType dtype);

// Adds to `request` a decode item of `request_id`: one row of RandomHidden(rng, 1, d_model, dtype).
v1::DecodeItem* AddRandomDecodeItem(v1::DecodeRequest* request, const std::string& request_id,
                                    std::mt19937_64& rng, int64_t d_model,
                                    DType dtype = DType::kF32);

// Root mean square of a tensor's values (a one-number fingerprint of an output).
double Rms(const Tensor& tensor);

// grpc.health.v1.Health/Check for `service` ("" = the whole server). Returns the status name
// in `serving_status` ("SERVING", "NOT_SERVING", "SERVICE_UNKNOWN", "UNKNOWN"). The health proto
// is not generated here (Debian ships no health.proto); the two tiny messages are encoded by hand.
grpc::Status CheckHealth(const Client& client, const std::string& service,
                         std::string* serving_status);

double NanosToMillis(int64_t nanos);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_COMMON_CLIENT_H_

// Helpers shared by the server integration tests: spec and tensor conversion to the wire types,
// an in-process reference (the same CPU engine the server runs, with the same seed weights), RPC
// wrappers that always carry a deadline, and byte-exact comparison of outputs.
#ifndef ATTNSERVE_TESTS_SUPPORT_SERVICE_TEST_UTIL_H_
#define ATTNSERVE_TESTS_SUPPORT_SERVICE_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attnserve/v1/attention_service.grpc.pb.h"
#include "kernels/backend.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/core/tensor.h"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve::server_test {

namespace v1 = ::attnserve::v1;

// Backend threads used by the server under test (--threads) and by the in-process reference.
// Equal counts give equal work splits, which bit-exact comparison relies on.
inline constexpr int kBackendThreads = 2;

// Wire conversions: proto/codec/ (shared with the server and the clients).

// [rows, d_model] with values U(-1, 1), cast to `dtype`.
Tensor RandomHidden(int64_t rows, int64_t d_model, std::mt19937_64& rng, DType dtype = DType::kF32);
// Rows [begin, end) of a rank-2 tensor.
Tensor SliceRows(const Tensor& tensor, int64_t begin, int64_t end);
// Rows of `parts` concatenated (all of one dtype and width).
Tensor ConcatRows(absl::Span<const Tensor> parts);

// Success when `actual` has the dtype, shape and exactly the bytes of `expected`; otherwise a
// message with the first differing element.
::testing::AssertionResult SameBytes(const v1::Tensor& actual, const Tensor& expected);

// ---- RPCs ------------------------------------------------------------------------------------

// Every call made by the tests carries a deadline: the default here, or the earlier `not_after`.
inline constexpr std::chrono::seconds kRpcTimeout(30);

void SetDeadline(grpc::ClientContext& context, std::chrono::milliseconds timeout = kRpcTimeout);

// A small causal GQA layer (d_model 64, 4 query / 2 KV heads of 16, q/k/v biases, RoPE half):
// cheap enough for tests that run many steps or long prompts.
LayerSpec SmallBiasedGqa();

// A Configure request for `spec` with seed weights (and default cache settings).
v1::ConfigureRequest SeedConfigure(const LayerSpec& spec, uint64_t seed);

// Thin wrappers: the call's grpc::Status, and the response through `response`.
grpc::Status Configure(v1::AttentionService::Stub& stub, const v1::ConfigureRequest& request,
                       v1::ConfigureResponse* response);
grpc::Status Forward(v1::AttentionService::Stub& stub, const v1::ForwardRequest& request,
                     v1::ForwardResponse* response);
grpc::Status Decode(v1::AttentionService::Stub& stub, const v1::DecodeRequest& request,
                    v1::DecodeResponse* response);
grpc::Status Release(v1::AttentionService::Stub& stub, const std::string& session_id,
                     const std::string& request_id, v1::ReleaseResponse* response = nullptr);
absl::StatusOr<v1::GetServerInfoResponse> ServerInfo(v1::AttentionService::Stub& stub);
// The KV pool's used bytes (GetServerInfo.kv_pool_used_bytes); -1, with a test failure, when the
// call fails.
int64_t PoolUsed(v1::AttentionService::Stub& stub);

v1::ForwardItem MakeForwardItem(const std::string& request_id, const Tensor& hidden,
                                absl::Span<const int64_t> positions = {});
v1::DecodeItem MakeDecodeItem(const std::string& request_id, const Tensor& hidden,
                              std::optional<int64_t> position = std::nullopt);

// A ForwardStream's first message: one new request of `hidden`'s rows (f32) in `session`.
v1::ForwardStreamRequest ForwardStreamHeaderOf(const std::string& session,
                                               const std::string& request_id,
                                               const Tensor& hidden);
// Rows [from, to) of `hidden` as one ForwardStream message.
v1::ForwardStreamRequest ForwardStreamRowsOf(const Tensor& hidden, int64_t from, int64_t to);

// "INVALID_ARGUMENT: message" for failure output.
std::string Describe(const grpc::Status& status);

// ---- Reference -------------------------------------------------------------------------------

// The server's computation in-process: CreateCpuBackend({kBackendThreads}) and a layer built from
// RandomLayerWeights(spec, seed), with request ids mapped to sequences. Calls mirror the RPCs one
// to one (a Forward with two items is one Prefill with two chunks), as the server makes them.
class ReferenceSession {
 public:
  static absl::StatusOr<std::unique_ptr<ReferenceSession>> Create(const LayerSpec& spec,
                                                                  uint64_t seed,
                                                                  DType kv_dtype = DType::kF32,
                                                                  int page_size = 0);
  static absl::StatusOr<std::unique_ptr<ReferenceSession>> Create(const LayerSpec& spec,
                                                                  const LayerWeights& weights,
                                                                  DType kv_dtype, int page_size);

  struct ForwardInput {
    std::string request_id;
    Tensor hidden;                   // [tokens, d_model]
    std::vector<int64_t> positions;  // empty or one per token (all items alike)
  };
  // One output per item, in order.
  absl::StatusOr<std::vector<Tensor>> Forward(const std::vector<ForwardInput>& items);

  struct DecodeInput {
    std::string request_id;
    Tensor hidden;  // [1, d_model]
    std::optional<int64_t> position;
  };
  absl::StatusOr<std::vector<Tensor>> Decode(const std::vector<DecodeInput>& items);

  absl::Status Release(const std::string& request_id);
  const LayerSpec& spec() const { return layer_->spec(); }

 private:
  std::unique_ptr<AttentionBackend> backend_;
  std::unique_ptr<AttentionLayer> layer_;
  std::map<std::string, SequenceId> sequences_;
};

}  // namespace attnserve::server_test

#endif  // ATTNSERVE_TESTS_SUPPORT_SERVICE_TEST_UTIL_H_

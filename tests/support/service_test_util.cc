#include "tests/support/service_test_util.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/model/layer_weights.h"

namespace attnserve::server_test {

Tensor RandomHidden(int64_t rows, int64_t d_model, std::mt19937_64& rng, DType dtype) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * d_model));
  for (float& v : values) v = uniform(rng);
  Tensor f32 = Tensor::FromFloats({rows, d_model}, values);
  return dtype == DType::kF32 ? f32 : f32.CastTo(dtype);
}

Tensor SliceRows(const Tensor& tensor, int64_t begin, int64_t end) {
  Tensor out(tensor.dtype(), {end - begin, tensor.dim(1)});
  const size_t row_bytes = static_cast<size_t>(tensor.dim(1)) * DTypeSize(tensor.dtype());
  std::memcpy(out.data(), tensor.data() + begin * row_bytes, out.num_bytes());
  return out;
}

Tensor ConcatRows(absl::Span<const Tensor> parts) {
  int64_t rows = 0;
  for (const Tensor& part : parts) rows += part.dim(0);
  Tensor out(parts.front().dtype(), {rows, parts.front().dim(1)});
  size_t offset = 0;
  for (const Tensor& part : parts) {
    std::memcpy(out.data() + offset, part.data(), part.num_bytes());
    offset += part.num_bytes();
  }
  return out;
}

::testing::AssertionResult SameBytes(const v1::Tensor& actual, const Tensor& expected) {
  if (actual.dtype() != DTypeToProto(expected.dtype())) {
    return ::testing::AssertionFailure()
           << "dtype " << v1::DType_Name(actual.dtype()) << ", expected "
           << v1::DType_Name(DTypeToProto(expected.dtype()));
  }
  const std::vector<int64_t> shape(actual.shape().begin(), actual.shape().end());
  if (shape != expected.shape()) {
    return ::testing::AssertionFailure()
           << "shape " << ShapeString(shape) << ", expected " << ShapeString(expected.shape());
  }
  if (actual.data().size() != expected.num_bytes()) {
    return ::testing::AssertionFailure()
           << actual.data().size() << " bytes, expected " << expected.num_bytes();
  }
  if (std::memcmp(actual.data().data(), expected.data(), expected.num_bytes()) == 0) {
    return ::testing::AssertionSuccess();
  }
  absl::StatusOr<Tensor> host = TensorFromProto(actual);
  const std::vector<float> got = host->ToFloats();
  const std::vector<float> want = expected.ToFloats();
  int64_t differing = 0, first = -1;
  float max_abs = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ++differing;
      if (first < 0) first = static_cast<int64_t>(i);
      max_abs = std::max(max_abs, std::abs(got[i] - want[i]));
    }
  }
  return ::testing::AssertionFailure()
         << differing << " of " << got.size() << " elements differ (max |diff| " << max_abs
         << "); first at flat index " << first << ": got " << got[first] << ", expected "
         << want[first];
}

// ---- RPCs ------------------------------------------------------------------------------------

void SetDeadline(grpc::ClientContext& context, std::chrono::milliseconds timeout) {
  context.set_deadline(std::chrono::system_clock::now() + timeout);
}

LayerSpec SmallBiasedGqa() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.qkv_bias = true;
  spec.rope = RopeLayout::kHalf;
  spec.causal = true;
  return spec;
}

v1::ConfigureRequest SeedConfigure(const LayerSpec& spec, uint64_t seed) {
  v1::ConfigureRequest request;
  *request.mutable_spec() = LayerSpecToProto(spec);
  request.mutable_weights()->set_seed(seed);
  return request;
}

grpc::Status Configure(v1::AttentionService::Stub& stub, const v1::ConfigureRequest& request,
                       v1::ConfigureResponse* response) {
  grpc::ClientContext context;
  SetDeadline(context);
  return stub.Configure(&context, request, response);
}

grpc::Status Forward(v1::AttentionService::Stub& stub, const v1::ForwardRequest& request,
                     v1::ForwardResponse* response) {
  grpc::ClientContext context;
  SetDeadline(context);
  return stub.Forward(&context, request, response);
}

grpc::Status Decode(v1::AttentionService::Stub& stub, const v1::DecodeRequest& request,
                    v1::DecodeResponse* response) {
  grpc::ClientContext context;
  SetDeadline(context);
  return stub.Decode(&context, request, response);
}

grpc::Status Release(v1::AttentionService::Stub& stub, const std::string& session_id,
                     const std::string& request_id, v1::ReleaseResponse* response) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::ReleaseRequest request;
  request.set_session_id(session_id);
  request.set_request_id(request_id);
  v1::ReleaseResponse ignored;
  return stub.Release(&context, request, response != nullptr ? response : &ignored);
}

absl::StatusOr<v1::GetServerInfoResponse> ServerInfo(v1::AttentionService::Stub& stub) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetServerInfoResponse response;
  grpc::Status status = stub.GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  return response;
}

int64_t PoolUsed(v1::AttentionService::Stub& stub) {
  absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub);
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? info->kv_pool_used_bytes() : -1;
}

v1::ForwardItem MakeForwardItem(const std::string& request_id, const Tensor& hidden,
                                absl::Span<const int64_t> positions) {
  v1::ForwardItem item;
  item.set_request_id(request_id);
  TensorToProto(hidden, item.mutable_hidden());
  for (int64_t p : positions) item.add_positions(p);
  return item;
}

v1::DecodeItem MakeDecodeItem(const std::string& request_id, const Tensor& hidden,
                              std::optional<int64_t> position) {
  v1::DecodeItem item;
  item.set_request_id(request_id);
  TensorToProto(hidden, item.mutable_hidden());
  if (position.has_value()) item.set_position(*position);
  return item;
}

v1::ForwardStreamRequest ForwardStreamHeaderOf(const std::string& session,
                                               const std::string& request_id,
                                               const Tensor& hidden) {
  v1::ForwardStreamRequest message;
  v1::ForwardStreamHeader* header = message.mutable_header();
  header->set_session_id(session);
  header->set_dtype(v1::DTYPE_F32);
  header->set_d_model(hidden.dim(1));
  v1::ForwardStreamItem* item = header->add_items();
  item->set_request_id(request_id);
  item->set_num_tokens(hidden.dim(0));
  return message;
}

v1::ForwardStreamRequest ForwardStreamRowsOf(const Tensor& hidden, int64_t from, int64_t to) {
  const Tensor slice = SliceRows(hidden, from, to);
  v1::ForwardStreamRequest message;
  message.mutable_rows()->set_data(
      std::string(reinterpret_cast<const char*>(slice.data()), slice.num_bytes()));
  return message;
}

std::string Describe(const grpc::Status& status) {
  // gRPC's codes are absl's, number for number.
  const int code = status.error_code();
  std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  if (name.empty()) name = std::to_string(code);
  return absl::StrCat(name, ": ", status.error_message());
}

// ---- Reference -------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ReferenceSession>> ReferenceSession::Create(const LayerSpec& spec,
                                                                           uint64_t seed,
                                                                           DType kv_dtype,
                                                                           int page_size) {
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, seed);
  if (!weights.ok()) return weights.status();
  return Create(spec, *weights, kv_dtype, page_size);
}

absl::StatusOr<std::unique_ptr<ReferenceSession>> ReferenceSession::Create(
    const LayerSpec& spec, const LayerWeights& weights, DType kv_dtype, int page_size) {
  std::unique_ptr<ReferenceSession> session(new ReferenceSession());
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend =
      CreateCpuBackend({.num_threads = kBackendThreads});
  if (!backend.ok()) return backend.status();
  session->backend_ = *std::move(backend);
  KvCacheConfig config;
  config.storage = kv_dtype;
  config.page_size = page_size;
  config.max_pages = 1 << 16;
  absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
      session->backend_->CreateLayer(spec, weights, config);
  if (!layer.ok()) return layer.status();
  session->layer_ = *std::move(layer);
  return session;
}

absl::StatusOr<std::vector<Tensor>> ReferenceSession::Forward(
    const std::vector<ForwardInput>& items) {
  std::vector<PrefillChunk> chunks;
  std::vector<Tensor> hidden_parts;
  std::vector<int64_t> positions;
  for (const ForwardInput& item : items) {
    auto [it, created] = sequences_.try_emplace(item.request_id, 0);
    if (created) it->second = layer_->CreateSequence();
    chunks.push_back({it->second, item.hidden.dim(0)});
    hidden_parts.push_back(item.hidden);
    positions.insert(positions.end(), item.positions.begin(), item.positions.end());
  }
  absl::StatusOr<Tensor> output = layer_->Prefill(chunks, ConcatRows(hidden_parts), positions);
  if (!output.ok()) return output.status();
  std::vector<Tensor> outputs;
  int64_t row = 0;
  for (const ForwardInput& item : items) {
    outputs.push_back(SliceRows(*output, row, row + item.hidden.dim(0)));
    row += item.hidden.dim(0);
  }
  return outputs;
}

absl::StatusOr<std::vector<Tensor>> ReferenceSession::Decode(
    const std::vector<DecodeInput>& items) {
  std::vector<SequenceId> ids;
  std::vector<Tensor> hidden_parts;
  std::vector<int64_t> positions;
  bool any_position = false;
  for (const DecodeInput& item : items) {
    auto it = sequences_.find(item.request_id);
    if (it == sequences_.end()) {
      return absl::NotFoundError(absl::StrCat("reference: no request ", item.request_id));
    }
    ids.push_back(it->second);
    hidden_parts.push_back(item.hidden);
    any_position |= item.position.has_value();
  }
  if (any_position) {
    for (const DecodeInput& item : items) {
      if (item.position.has_value()) {
        positions.push_back(*item.position);
      } else {
        absl::StatusOr<int64_t> length = layer_->SequenceLength(sequences_.at(item.request_id));
        if (!length.ok()) return length.status();
        positions.push_back(*length);
      }
    }
  }
  absl::StatusOr<Tensor> output = layer_->Decode(ids, ConcatRows(hidden_parts), positions);
  if (!output.ok()) return output.status();
  std::vector<Tensor> outputs;
  for (size_t i = 0; i < items.size(); ++i) {
    outputs.push_back(SliceRows(*output, static_cast<int64_t>(i), static_cast<int64_t>(i) + 1));
  }
  return outputs;
}

absl::Status ReferenceSession::Release(const std::string& request_id) {
  auto it = sequences_.find(request_id);
  if (it == sequences_.end()) return absl::NotFoundError(request_id);
  absl::Status status = layer_->ReleaseSequence(it->second);
  sequences_.erase(it);
  return status;
}

}  // namespace attnserve::server_test

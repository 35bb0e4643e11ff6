// Fuzzes the validation of a Configure request, as far as it runs without a server: the input is an
// attnserve.v1.ConfigureRequest, and the target takes it through the steps AttentionServiceImpl::
// DoConfigure takes before it creates a layer: LayerSpecFromProto (ValidateLayerSpec), the KV cache
// dtype, the page size, the KV pool's per-page check (server/session/kv_pool.h, a 1 GiB pool), the
// sizes the session reports (parameter count, KV bytes per token) and, for inline weights,
// WeightsFromProto (server/session/weight_source.h: every tensor decoded, names distinct, shapes
// checked against the spec).
//
// Not fuzzed here, on purpose: weights from a seed (they are allocated at the spec's size, up to
// gigabytes, which is the budget check's job, not a parser's) and from a checkpoint path (that
// opens files on this machine; safetensors_fuzzer fuzzes the file contents instead).
//
// Properties: every step returns a value or INVALID_ARGUMENT (never crashes); the sizes of an
// accepted spec are positive and computed without overflow (UBSan); accepted inline weights hold
// exactly the tensors ExpectedWeightShapes names.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/core/tensor.h"
#include "kernels/model/layer_weights.h"
#include "kernels/spec/layer_spec.h"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"
#include "server/session/kv_pool.h"
#include "server/session/weight_source.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

void CheckInvalidArgument(const absl::Status& status) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument, status.ToString());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnserve;
  v1::ConfigureRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;

  absl::StatusOr<LayerSpec> spec = LayerSpecFromProto(request.spec());
  if (!spec.ok()) {
    CheckInvalidArgument(spec.status());
    return 0;
  }
  DType kv_dtype = DType::kF32;
  if (request.kv_cache_dtype() != v1::DTYPE_UNSPECIFIED) {
    absl::StatusOr<DType> parsed = DTypeFromProto(request.kv_cache_dtype(), "kv_cache_dtype");
    if (!parsed.ok()) {
      CheckInvalidArgument(parsed.status());
      return 0;
    }
    kv_dtype = *parsed;
  }
  if (request.page_size() < 0) return 0;  // DoConfigure refuses it before any computation.
  const int page_size = request.page_size() == 0 ? DefaultPageSize(*spec) : request.page_size();

  const int64_t parameters = ParameterCount(*spec);
  FUZZ_CHECK(parameters > 0, LayerSpecSummary(*spec));
  FUZZ_CHECK(KvBytesPerToken(*spec, kv_dtype) > 0, LayerSpecSummary(*spec));

  const server::KvPool pool(int64_t{1} << 30);
  absl::StatusOr<KvCacheConfig> kv_config = pool.ConfigFor(*spec, kv_dtype, page_size);
  if (kv_config.ok()) {
    FUZZ_CHECK(kv_config->max_pages >= 1, LayerSpecSummary(*spec));
    FUZZ_CHECK(kv_config->page_size == page_size, "page size changed");
  } else {
    CheckInvalidArgument(kv_config.status());
  }

  if (request.weights().source_case() == v1::WeightSource::kInlineWeights) {
    absl::StatusOr<LayerWeights> weights = server::WeightsFromProto(request.weights(), *spec);
    if (!weights.ok()) {
      CheckInvalidArgument(weights.status());
      return 0;
    }
    const std::vector<WeightShape> expected = ExpectedWeightShapes(*spec);
    FUZZ_CHECK(weights->size() == expected.size(), "weight count");
    for (const WeightShape& shape : expected) {
      auto it = weights->find(shape.name);
      FUZZ_CHECK(it != weights->end(), shape.name + " missing");
      FUZZ_CHECK(it->second.shape() == shape.shape, shape.name + " mis-shaped");
    }
  }
  return 0;
}

// Fuzzes the wire layer-spec codec (proto/codec/spec_codec.h) with an attnserve.v1.LayerSpec parsed
// from the input, as every Configure carries one.
//
// Properties: LayerSpecFromProto returns a validated spec or INVALID_ARGUMENT (never crashes); the
// derived sizes of an accepted spec (head widths, KV bytes per token, parameter count, default page
// size, summary) are computed without overflow (UBSan checks) and are positive; an accepted spec
// survives LayerSpecToProto -> LayerSpecFromProto and LayerSpecToJson -> LayerSpecFromJson
// unchanged (compared through its JSON form, which writes every field).
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/core/tensor.h"
#include "kernels/model/layer_weights.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/spec/layer_spec_json.h"
#include "proto/codec/spec_codec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnserve;
  v1::LayerSpec proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;

  absl::StatusOr<LayerSpec> spec = LayerSpecFromProto(proto);
  if (!spec.ok()) {
    FUZZ_CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument,
               spec.status().ToString());
    return 0;
  }

  FUZZ_CHECK(QkHeadDim(*spec) > 0 && VHeadDim(*spec) > 0, LayerSpecSummary(*spec));
  FUZZ_CHECK(RotaryDim(*spec) >= 0, LayerSpecSummary(*spec));
  FUZZ_CHECK(EffectiveSoftmaxScale(*spec) > 0.0f, LayerSpecSummary(*spec));
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    FUZZ_CHECK(KvBytesPerToken(*spec, dtype) > 0, LayerSpecSummary(*spec));
  }
  FUZZ_CHECK(ParameterCount(*spec) > 0, LayerSpecSummary(*spec));
  FUZZ_CHECK(DefaultPageSize(*spec) > 0, LayerSpecSummary(*spec));
  FUZZ_CHECK(!ExpectedWeightShapes(*spec).empty(), LayerSpecSummary(*spec));

  const std::string json = LayerSpecToJson(*spec);
  absl::StatusOr<LayerSpec> from_proto = LayerSpecFromProto(LayerSpecToProto(*spec));
  FUZZ_CHECK(from_proto.ok(), from_proto.status().ToString());
  FUZZ_CHECK(LayerSpecToJson(*from_proto) == json,
             json + " became " + LayerSpecToJson(*from_proto));
  absl::StatusOr<LayerSpec> from_json = LayerSpecFromJson(json);
  FUZZ_CHECK(from_json.ok(), from_json.status().ToString() + " for " + json);
  FUZZ_CHECK(LayerSpecToJson(*from_json) == json, json + " became " + LayerSpecToJson(*from_json));
  return 0;
}

// Fuzzes the JSON layer-spec reader (kernels/spec/layer_spec_json.h) that attnctl, attnbench and
// the peer test read spec files with: the input is the file's text.
//
// Properties: LayerSpecFromJson returns a validated spec or INVALID_ARGUMENT (never throws or
// crashes, whatever the JSON nesting, types or numbers); an accepted spec survives
// LayerSpecToJson -> LayerSpecFromJson and LayerSpecToProto -> LayerSpecFromProto unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/spec/layer_spec_json.h"
#include "proto/codec/spec_codec.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnserve;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(text);
  if (!spec.ok()) {
    FUZZ_CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument,
               spec.status().ToString());
    return 0;
  }
  const std::string json = LayerSpecToJson(*spec);
  absl::StatusOr<LayerSpec> again = LayerSpecFromJson(json);
  FUZZ_CHECK(again.ok(), again.status().ToString() + " for " + json);
  FUZZ_CHECK(LayerSpecToJson(*again) == json, json + " became " + LayerSpecToJson(*again));
  absl::StatusOr<LayerSpec> from_proto = LayerSpecFromProto(LayerSpecToProto(*spec));
  FUZZ_CHECK(from_proto.ok(), from_proto.status().ToString() + " for " + json);
  FUZZ_CHECK(LayerSpecToJson(*from_proto) == json,
             json + " became " + LayerSpecToJson(*from_proto));
  return 0;
}

// The wire layer-spec codec (proto/codec/spec_codec.h): what a LayerSpec proto means after
// LayerSpecFromProto, and that an accepted spec survives LayerSpecToProto -> LayerSpecFromProto
// unchanged. The fuzz target spec_codec_fuzzer checks the round trip on random protos; the cases
// here are the ones it found, kept as regressions.
#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "gtest/gtest.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/spec/layer_spec_json.h"
#include "proto/codec/spec_codec.h"

namespace attnserve {
namespace {

v1::LayerSpec SmallMqa() {
  v1::LayerSpec proto;
  proto.set_variant(v1::VARIANT_MQA);
  proto.set_d_model(8);
  proto.set_num_heads(4);
  proto.set_num_kv_heads(1);
  proto.set_head_dim(2);
  return proto;
}

// Found by spec_codec_fuzzer: alibi_bias_max set on a spec without ALiBi was kept by
// LayerSpecFromProto but not written back by LayerSpecToProto (which writes it only with ALiBi),
// so the spec changed in a round trip. Without ALiBi the slope range means nothing: it reads as
// the default.
TEST(SpecCodecTest, AlibiBiasMaxWithoutAlibiReadsAsTheDefault) {
  v1::LayerSpec proto = SmallMqa();
  proto.set_alibi(v1::ALIBI_NONE);
  proto.set_alibi_bias_max(87840880.0f);
  absl::StatusOr<LayerSpec> spec = LayerSpecFromProto(proto);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->alibi_bias_max, 8.0f);
  absl::StatusOr<LayerSpec> again = LayerSpecFromProto(LayerSpecToProto(*spec));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(LayerSpecToJson(*again), LayerSpecToJson(*spec));
}

TEST(SpecCodecTest, AlibiBiasMaxRoundTripsWithAlibi) {
  for (v1::Alibi alibi : {v1::ALIBI_BLOOM, v1::ALIBI_MPT}) {
    v1::LayerSpec proto = SmallMqa();
    proto.set_alibi(alibi);
    proto.set_alibi_bias_max(16.0f);
    absl::StatusOr<LayerSpec> spec = LayerSpecFromProto(proto);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->alibi_bias_max, 16.0f);
    absl::StatusOr<LayerSpec> again = LayerSpecFromProto(LayerSpecToProto(*spec));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(LayerSpecToJson(*again), LayerSpecToJson(*spec));
  }
  // Unset (0) on the wire is MPT's default of 8.
  v1::LayerSpec proto = SmallMqa();
  proto.set_alibi(v1::ALIBI_MPT);
  absl::StatusOr<LayerSpec> spec = LayerSpecFromProto(proto);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->alibi_bias_max, 8.0f);
}

}  // namespace
}  // namespace attnserve

// The wire layer-spec codec (proto/codec/spec_codec.h): what a LayerSpec proto means after
// LayerSpecFromProto, and that an accepted spec survives LayerSpecToProto -> LayerSpecFromProto
// unchanged. The fuzz target spec_codec_fuzzer checks the round trip on random protos; the cases
// here are the ones it found, kept as regressions.
#include <set>
#include <string>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "attnserve/v1/attention_service.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"
#include "kernels/base/overloaded.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/spec/spec_field.h"
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

std::string DeterministicBytes(const v1::LayerSpec& proto) {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  proto.SerializeToCodedStream(&coded);
  coded.Trim();
  return bytes;
}

// LayerSpecToProto's bytes (what LayerFingerprint hashes), pinned as the hand-written codec wrote
// them before the fields came from LayerSpecFields(): a session's fingerprint must not change.
TEST(SpecCodecTest, PinsTheWireBytes) {
  const struct {
    const char* name;
    const char* json;
    const char* hex;
  } kCases[] = {
      {"every_field",
       R"({"variant": "gqa", "d_model": 128, "num_heads": 8, "num_kv_heads": 2, "head_dim": 16,
       "qkv_bias": true, "o_bias": true, "rope": "interleaved", "rope_theta": 500000,
       "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 4096,
       "beta_fast": 16, "beta_slow": 2, "mscale": 1, "mscale_all_dim": 0.5, "truncate": false},
       "causal": true, "sliding_window": 64, "softmax_scale": 0.1, "rotary_dim": 8,
       "qk_norm": "rms_unit_offset", "qk_norm_eps": 1e-5, "attn_logit_softcapping": 30,
       "attention_sinks": true, "alibi": "mpt", "alibi_bias_max": 6})",
       "0803108001180820022810300138014002490000000080841e415001584065cdcccc3d7246080411"
       "000000000000104018802021000000000000f03f2900000000000010403100000000000030403900"
       "0000000000004041000000000000f03f49000000000000e03f500078088001028d01acc527379501"
       "0000f041980101a00102ad010000c040"},
      {"mla",
       R"({"variant": "mla", "d_model": 64, "num_heads": 4, "rope": "interleaved",
       "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
       "mscale": 1, "mscale_all_dim": 0.707}, "mla": {"q_lora_rank": 24, "kv_lora_rank": 32,
       "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "rms_norm_eps": 1e-5}})",
       "080410401804400249000000000088c34050016a0f0818102018102008281035acc5273772460804"
       "11000000000000444018802021000000000000f03f29000000000000104031000000000000404039"
       "000000000000f03f41000000000000f03f4939b4c876be9fe63f50018d01bd378635"},
      {"llama3",
       R"({"variant": "gqa", "d_model": 64, "num_heads": 4, "num_kv_heads": 2,
       "rope_scaling": {"type": "llama3", "factor": 8, "original_max_position_embeddings": 8192,
       "low_freq_factor": 2, "high_freq_factor": 8}, "causal": false})",
       "08031040180420022810400149000000000088c34072320803110000000000002040188040210000"
       "00000000004029000000000000204031000000000000404039000000000000f03f8d01bd378635"},
      {"minimal_mha",
       R"({"variant": "mha", "d_model": 64, "num_heads": 4})",
       "08011040180420042810400149000000000088c34050018d01bd378635"},
      {"alibi_max_without_alibi",
       R"({"variant": "mha", "d_model": 64, "num_heads": 4, "alibi_bias_max": 4,
       "qk_norm": "rms"})",
       "08011040180420042810400149000000000088c34050018001018d01bd378635"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(c.json);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const v1::LayerSpec proto = LayerSpecToProto(*spec);
    EXPECT_EQ(absl::BytesToHexString(DeterministicBytes(proto)), c.hex);
    // Read back, it writes the same bytes (alibi_bias_max without ALiBi reads as the default).
    absl::StatusOr<LayerSpec> back = LayerSpecFromProto(proto);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(absl::BytesToHexString(DeterministicBytes(LayerSpecToProto(*back))), c.hex);
  }
}

// Refusals keep their messages and order (the first bad field in the fields' order), as the
// hand-written codec gave them.
TEST(SpecCodecTest, RefusesWithTheSameMessages) {
  const auto with = [](auto change) {
    v1::LayerSpec proto = SmallMqa();
    change(proto);
    return proto;
  };
  const struct {
    v1::LayerSpec proto;
    const char* message;
  } kCases[] = {
      {with([](v1::LayerSpec& p) { p.clear_variant(); }),
       "spec.variant: must be set (VARIANT_MHA, VARIANT_MQA, VARIANT_GQA or VARIANT_MLA)"},
      {with([](v1::LayerSpec& p) { p.set_variant(static_cast<v1::Variant>(9)); }),
       "spec.variant: unknown value 9"},
      {with([](v1::LayerSpec& p) { p.set_rope(static_cast<v1::RopeLayout>(7)); }),
       "spec.rope: unknown value 7"},
      {with([](v1::LayerSpec& p) { p.set_qk_norm(static_cast<v1::QkNorm>(9)); }),
       "spec.qk_norm: unknown value 9"},
      {with([](v1::LayerSpec& p) { p.set_alibi(static_cast<v1::Alibi>(5)); }),
       "spec.alibi: unknown value 5"},
      {with([](v1::LayerSpec& p) { p.set_qk_norm(static_cast<v1::QkNorm>(9));
                   p.set_alibi(static_cast<v1::Alibi>(5)); }),
       "spec.qk_norm: unknown value 9"},
      {with([](v1::LayerSpec& p) {
         p.mutable_rope_scaling()->set_type(static_cast<v1::RopeScalingType>(9));
       }),
       "spec.rope_scaling.type: unknown value 9"},
      {with([](v1::LayerSpec& p) { p.set_alibi(v1::ALIBI_MPT);
                   p.set_alibi_bias_max(-1); }),
       "spec: alibi_bias_max = -1: must be finite and > 0"},
      {with([](v1::LayerSpec& p) { p.set_qk_norm_eps(-1); }),
       "spec: qk_norm_eps = -1: must be finite and > 0"},
      {with([](v1::LayerSpec& p) { p.set_variant(v1::VARIANT_MLA); }),
       "spec: mla.kv_lora_rank = 0: must be in [1, 65536]"},
      {with([](v1::LayerSpec& p) { p.set_num_kv_heads(2); }),
       "spec: num_kv_heads = 2: variant mqa requires num_kv_heads == 1"},
      {with([](v1::LayerSpec& p) { p.set_rope_theta(0.5); }),
       "spec: rope_theta = 0.5: must be finite and > 1"},
  };
  for (const auto& c : kCases) {
    absl::StatusOr<LayerSpec> spec = LayerSpecFromProto(c.proto);
    ASSERT_FALSE(spec.ok()) << c.proto.ShortDebugString();
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(spec.status().message(), c.message) << c.proto.ShortDebugString();
  }
}

using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;


FieldDescriptor::CppType CppTypeOf(const SpecMember& member) {
  return std::visit(
      Overloaded{
          [](int LayerSpec::*) { return FieldDescriptor::CPPTYPE_INT32; },
          [](float LayerSpec::*) { return FieldDescriptor::CPPTYPE_FLOAT; },
          [](double LayerSpec::*) { return FieldDescriptor::CPPTYPE_DOUBLE; },
          [](bool LayerSpec::*) { return FieldDescriptor::CPPTYPE_BOOL; },
          [](const EnumMember&) { return FieldDescriptor::CPPTYPE_ENUM; },
          [](RopeScaling LayerSpec::*) { return FieldDescriptor::CPPTYPE_MESSAGE; },
          [](MlaDims LayerSpec::*) { return FieldDescriptor::CPPTYPE_MESSAGE; },
      },
      member);
}

// The codec reads and writes each row as the proto field of its number: that field has the row's
// name and a matching type, every proto field has a row, and each enum's names are the proto's
// values (prefix + name in upper case) both ways.
TEST(SpecCodecTest, FieldTableMatchesTheProto) {
  const google::protobuf::Descriptor& proto = *v1::LayerSpec::descriptor();
  std::set<int> numbers;
  for (const SpecField& field : LayerSpecFields()) {
    SCOPED_TRACE(std::string(field.name));
    const FieldDescriptor* wire = proto.FindFieldByNumber(field.proto_number);
    ASSERT_NE(wire, nullptr);
    EXPECT_EQ(std::string(wire->name()), field.name);
    EXPECT_FALSE(wire->is_repeated());
    EXPECT_EQ(wire->cpp_type(), CppTypeOf(field.member));
    EXPECT_TRUE(numbers.insert(field.proto_number).second) << "two rows of one number";
    const auto* member = std::get_if<EnumMember>(&field.member);
    if (member == nullptr) continue;
    const EnumDescriptor& type = *wire->enum_type();
    const std::string prefix = SpecEnumPrefix(type);
    EXPECT_FALSE(prefix.empty());
    for (int i = 0; i < type.value_count(); ++i) {
      const std::string name(type.value(i)->name());
      ASSERT_TRUE(absl::StartsWith(name, prefix)) << name;
      if (name == prefix + "UNSPECIFIED") continue;
      absl::StatusOr<int> parsed = member->parse(absl::AsciiStrToLower(name.substr(prefix.size())));
      ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status();
      EXPECT_EQ(prefix + absl::AsciiStrToUpper(member->name(*parsed)), name);
    }
    // The C++ names: every value the enum's Name function knows ("unknown" past the last).
    int named = 0;
    for (int value = 0; value < 256; ++value) {
      const absl::string_view name = member->name(value);
      if (name == "unknown") continue;
      ++named;
      EXPECT_NE(type.FindValueByName(prefix + absl::AsciiStrToUpper(name)), nullptr) << name;
    }
    EXPECT_GT(named, 1);
  }
  EXPECT_EQ(static_cast<int>(numbers.size()), proto.field_count()) << "a proto field has no row";
}

}  // namespace
}  // namespace attnserve

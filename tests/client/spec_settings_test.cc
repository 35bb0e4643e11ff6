// attnctl's --spec=KEY=VALUE (client/attnctl/spec_settings.h): a setting of each kind (integer,
// float, double, bool, enum by name, nested object) lands in its field; every row of the spec's
// field table is settable, so a new field needs no attnctl change; and a bad key or value is
// refused naming it.
#include "client/attnctl/spec_settings.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/spec/layer_spec_json.h"
#include "kernels/spec/spec_field.h"
#include "nlohmann/json.hpp"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

LayerSpec Base() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.rope = RopeLayout::kHalf;
  return spec;
}

LayerSpec Apply(const std::vector<std::string>& settings) {
  absl::StatusOr<LayerSpec> spec = ApplySpecSettings(Base(), settings);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : LayerSpec();
}

TEST(SpecSettingsTest, EachKindLandsInItsField) {
  EXPECT_EQ(Apply({"d_model=128"}).d_model, 128);             // int
  EXPECT_EQ(Apply({"qk_norm_eps=1e-5"}).qk_norm_eps, 1e-5f);  // float
  EXPECT_EQ(Apply({"attn_logit_softcapping=30"}).attn_logit_softcapping, 30.0f);
  EXPECT_EQ(Apply({"rope_theta=500000.5"}).rope_theta, 500000.5);  // double
  EXPECT_TRUE(Apply({"attention_sinks=true"}).attention_sinks);    // bool
  EXPECT_FALSE(Apply({"causal=false"}).causal);
  EXPECT_EQ(Apply({"qk_norm=rms_across_heads"}).qk_norm, QkNorm::kRmsAcrossHeads);  // enum
  EXPECT_EQ(Apply({"alibi=bloom", "rope=none"}).alibi, Alibi::kBloom);
  const LayerSpec yarn = Apply({"rope_scaling.type=yarn", "rope_scaling.factor=4",
                                "rope_scaling.original_max_position_embeddings=4096",
                                "rope_scaling.truncate=false"});  // nested
  EXPECT_EQ(yarn.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_EQ(yarn.rope_scaling.factor, 4.0);
  EXPECT_EQ(yarn.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_FALSE(yarn.rope_scaling.truncate);
  // The rest of the base is kept.
  EXPECT_EQ(yarn.num_kv_heads, 2);
  EXPECT_EQ(yarn.head_dim, 16);
  EXPECT_EQ(yarn.rope, RopeLayout::kHalf);
}

TEST(SpecSettingsTest, ANestedObjectIsTheSettingsAlone) {
  LayerSpec base = Base();
  base.rope_scaling = {.type = RopeScalingType::kYarn,
                       .factor = 4.0,
                       .original_max_position_embeddings = 4096,
                       .truncate = false};
  // Merged into the YaRN object, linear would meet YaRN's keys and be refused.
  absl::StatusOr<LayerSpec> linear =
      ApplySpecSettings(base, {"rope_scaling.type=linear", "rope_scaling.factor=2"});
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(linear->rope_scaling.factor, 2.0);
  EXPECT_TRUE(linear->rope_scaling.truncate);
}

TEST(SpecSettingsTest, AloneTheSettingsAreASpecFile) {
  absl::StatusOr<LayerSpec> mla = ApplySpecSettings(
      std::nullopt, {"variant=mla", "d_model=64", "num_heads=4", "mla.kv_lora_rank=32",
                     "mla.qk_nope_head_dim=16", "mla.qk_rope_head_dim=8", "mla.v_head_dim=16"});
  ASSERT_TRUE(mla.ok()) << mla.status();
  absl::StatusOr<LayerSpec> file = LayerSpecFromJson(R"({"variant": "mla", "d_model": 64,
      "num_heads": 4, "mla": {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
      "v_head_dim": 16}})");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(LayerSpecToJson(*mla), LayerSpecToJson(*file));
  // The file's defaults: RoPE half, num_kv_heads = num_heads for mha.
  absl::StatusOr<LayerSpec> mha =
      ApplySpecSettings(std::nullopt, {"variant=mha", "d_model=64", "num_heads=4"});
  ASSERT_TRUE(mha.ok()) << mha.status();
  EXPECT_EQ(mha->rope, RopeLayout::kHalf);
  EXPECT_EQ(mha->num_kv_heads, 4);
  EXPECT_EQ(mha->head_dim, 16);
  // And what a file requires, --spec alone requires.
  absl::StatusOr<LayerSpec> partial = ApplySpecSettings(std::nullopt, {"variant=gqa"});
  EXPECT_THAT(partial.status().message(), HasSubstr("d_model: missing required key"));
}

// Every row of LayerSpecFields(), set from a spec whose every field differs from the base's: the
// settings come from the table, so a field added to it is covered without changing this test.
TEST(SpecSettingsTest, EveryFieldOfTheTableIsSettable) {
  LayerSpec target = Base();
  target.variant = AttentionVariant::kMHA;
  target.d_model = 96;
  target.num_heads = 6;
  target.num_kv_heads = 6;
  target.head_dim = 8;
  target.qkv_bias = target.o_bias = true;
  target.rope = RopeLayout::kInterleaved;
  target.rope_theta = 250000.0;
  target.rope_scaling = {.type = RopeScalingType::kLlama3,
                         .factor = 8.0,
                         .original_max_position_embeddings = 8192,
                         .low_freq_factor = 2.0,
                         .high_freq_factor = 5.0};
  target.sliding_window = 16;
  target.softmax_scale = 0.25f;
  target.rotary_dim = 4;
  target.qk_norm = QkNorm::kRmsUnitOffset;
  target.qk_norm_eps = 1e-5f;
  target.attn_logit_softcapping = 30.0f;
  target.attention_sinks = true;
  target.alibi = Alibi::kMpt;
  target.alibi_bias_max = 4.0f;
  ASSERT_TRUE(ValidateLayerSpec(target).ok()) << ValidateLayerSpec(target);
  const nlohmann::json json = nlohmann::json::parse(LayerSpecToJson(target));
  std::vector<std::string> settings;
  for (const SpecField& field : LayerSpecFields()) {
    const std::string key(field.name);
    if (!json.contains(key)) continue;  // mla: only for variant mla (AloneTheSettingsAreASpecFile).
    const nlohmann::json& value = json.at(key);
    if (value.is_object()) {
      for (const auto& [sub, sub_value] : value.items()) {
        settings.push_back(
            key + "." + sub + "=" +
            (sub_value.is_string() ? sub_value.get<std::string>() : sub_value.dump()));
      }
    } else {
      settings.push_back(key + "=" + (value.is_string() ? value.get<std::string>() : value.dump()));
    }
  }
  absl::StatusOr<LayerSpec> set = ApplySpecSettings(Base(), settings);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(LayerSpecToJson(*set), LayerSpecToJson(target));
}

TEST(SpecSettingsTest, RefusesBadKeysAndValuesByName) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"d_model"}, "--spec d_model: expected KEY=VALUE"},
      {{"=3"}, "--spec =3: expected KEY=VALUE"},
      {{"num_head=4"}, "--spec: num_head: unknown key (known keys: variant, d_model"},
      {{"d_model=abc"}, "--spec: d_model: expected an integer, got string \"abc\""},
      {{"d_model=2.5"}, "--spec: d_model: expected an integer, got number 2.5"},
      {{"causal=yes"}, "--spec: causal: expected true or false"},
      {{"qk_norm_eps=small"}, "--spec: qk_norm_eps: expected a number"},
      {{"qk_norm=rsm"}, "--spec: qk_norm: unknown 'rsm', expected none, rms"},
      {{"qk_norm=1"}, "--spec: qk_norm: expected a string, got integer 1"},
      {{"rope_scaling.factor=2"}, "--spec: rope_scaling.type: missing required key"},
      {{"rope_scaling.type=linear", "rope_scaling.beta_fast=2"},
       "--spec: rope_scaling.beta_fast: unknown key"},
      {{"mla.kv_lora_rank=32"}, "--spec: mla: only allowed with variant mla, not gqa"},
      {{"d_model.x=1"}, "--spec: d_model: expected an integer, got object"},
      {{"sliding_window=-1"}, "--spec: sliding_window = -1: must be >= 0"},
  };
  for (const auto& [settings, message] : cases) {
    absl::StatusOr<LayerSpec> spec = ApplySpecSettings(Base(), settings);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << settings[0];
    EXPECT_THAT(spec.status().message(), HasSubstr(message)) << settings[0];
  }
}

TEST(SpecSettingsTest, HelpListsEveryKeyWithItsNames) {
  const std::string help = SpecSettingsHelp();
  for (const SpecField& field : LayerSpecFields()) {
    EXPECT_THAT(help, HasSubstr(absl::StrCat("  ", field.name, ": "))) << field.name;
  }
  EXPECT_THAT(help, HasSubstr("qk_norm: none | rms | rms_unit_offset | rms_across_heads"));
  EXPECT_THAT(help, HasSubstr("alibi: none | bloom | mpt"));
  EXPECT_THAT(help, HasSubstr("d_model: integer"));
  EXPECT_THAT(help, HasSubstr("attention_sinks: true | false"));
}

}  // namespace
}  // namespace attnserve

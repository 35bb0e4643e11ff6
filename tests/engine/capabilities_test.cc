// The capability check (kernels/capabilities.h): each capability turned off in a table refuses the
// spec, KV format or operation that needs it, naming the field and the backend's limit, with the
// code that refusal had before the table; the CPU table accepts everything the engine computes;
// the CUDA table refuses what its kernels do not do.
#include "kernels/capabilities.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_capabilities.h"
#include "kernels/cuda/cuda_capabilities.h"
#include "kernels/kv/quantization.h"
#include "kernels/model/layer_weights.h"
#include "kernels/spec/attention_variation.h"

namespace attnserve {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

LayerSpec Gqa() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 256;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.rope = RopeLayout::kHalf;
  return spec;
}

LayerSpec Mla() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMLA;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.rope = RopeLayout::kInterleaved;
  spec.mla = {.q_lora_rank = 0,
              .kv_lora_rank = 32,
              .qk_nope_head_dim = 16,
              .qk_rope_head_dim = 8,
              .v_head_dim = 16,
              .rms_norm_eps = 1e-6f};
  return spec;
}

KvCacheConfig Kv(KvStorageFormat format) { return KvCacheConfig{format, 16, 64, nullptr}; }

// One capability: the table with it off, a valid spec and KV format that need it, and what the
// refusal must say.
struct Case {
  std::string name;
  std::function<void(BackendCapabilities&)> turn_off;
  LayerSpec spec;
  KvStorageFormat kv = DType::kF32;
  absl::StatusCode code;
  std::string field;  // Named in the message, as "<field> = ..." or "<field>:".
  std::string limit;  // The backend's real limit, as the message gives it.
};

// Turns the variation `name` off in a table.
std::function<void(BackendCapabilities&)> Drop(std::string name) {
  return [name](BackendCapabilities& c) { std::erase(c.variations, name); };
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"variant", [](BackendCapabilities& c) { c.variants = {AttentionVariant::kGQA}; },
                   Mla(), DType::kF32, absl::StatusCode::kUnimplemented, "variant = mla",
                   "it serves gqa"});
  cases.push_back({"head_dims", [](BackendCapabilities& c) { c.head_dims = {128}; }, Gqa(),
                   DType::kF32, absl::StatusCode::kInvalidArgument, "head_dim = 64",
                   "head dims 128"});
  LayerSpec qk_norm = Gqa();
  qk_norm.qk_norm = QkNorm::kRmsUnitOffset;
  LayerSpec qwen3 = Gqa();
  qwen3.qk_norm = QkNorm::kRms;
  cases.push_back({"qk_norm=rms", Drop("qk_norm=rms"), qwen3, DType::kF32,
                   absl::StatusCode::kInvalidArgument, "qk_norm = rms", "q/k norm"});
  cases.push_back({"qk_norm=rms_unit_offset", Drop("qk_norm=rms_unit_offset"), qk_norm,
                   DType::kF32, absl::StatusCode::kInvalidArgument, "qk_norm = rms_unit_offset",
                   "q/k norm"});
  LayerSpec olmo2 = Gqa();
  olmo2.qk_norm = QkNorm::kRmsAcrossHeads;
  cases.push_back({"qk_norm=rms_across_heads", Drop("qk_norm=rms_across_heads"), olmo2,
                   DType::kF32, absl::StatusCode::kInvalidArgument, "qk_norm = rms_across_heads",
                   "q/k norm across heads (OLMo 2)"});
  LayerSpec cohere = Gqa();
  cohere.qk_norm = QkNorm::kLayerNorm;
  cases.push_back({"qk_norm=layer_norm", Drop("qk_norm=layer_norm"), cohere, DType::kF32,
                   absl::StatusCode::kInvalidArgument, "qk_norm = layer_norm",
                   "q/k LayerNorm (StableLM 2, Cohere)"});
  LayerSpec alibi = Gqa();
  alibi.alibi = Alibi::kMpt;
  cases.push_back({"alibi", Drop("alibi"), alibi, DType::kF32,
                   absl::StatusCode::kInvalidArgument, "alibi = mpt", "does not implement ALiBi"});
  LayerSpec partial = Gqa();
  partial.rotary_dim = 32;
  cases.push_back({"partial_rotary", Drop("partial_rotary"),
                   partial, DType::kF32, absl::StatusCode::kInvalidArgument,
                   "rotary_dim = 32 (of head_dim 64)", "partial rotary"});
  LayerSpec softcap = Gqa();
  softcap.attn_logit_softcapping = 50.0f;
  cases.push_back({"logit_softcapping", Drop("logit_softcapping"),
                   softcap, DType::kF32, absl::StatusCode::kInvalidArgument,
                   "attn_logit_softcapping = 50", "soft-capping"});
  LayerSpec sinks = Gqa();
  sinks.attention_sinks = true;
  cases.push_back({"attention_sinks", Drop("attention_sinks"),
                   sinks, DType::kF32, absl::StatusCode::kInvalidArgument, "attention_sinks = true",
                   "attention sinks"});
  LayerSpec window = Gqa();
  window.sliding_window = 16;
  cases.push_back({"sliding_window", Drop("sliding_window"),
                   window, DType::kF32, absl::StatusCode::kInvalidArgument, "sliding_window = 16",
                   "sliding windows"});
  LayerSpec bidirectional = Gqa();
  bidirectional.causal = false;
  cases.push_back({"non_causal", Drop("non_causal"),
                   bidirectional, DType::kF32, absl::StatusCode::kInvalidArgument, "causal = false",
                   "non-causal"});
  LayerSpec linear = Gqa();
  linear.rope_scaling = {.type = RopeScalingType::kLinear, .factor = 2.0};
  cases.push_back({"rope_scalings",
                   [](BackendCapabilities& c) {
                     c.rope_scalings = {RopeScalingType::kNone, RopeScalingType::kYarn};
                   },
                   linear, DType::kF32, absl::StatusCode::kInvalidArgument,
                   "rope_scaling.type = linear", "applies none, yarn"});
  LayerSpec yarn = Gqa();
  yarn.rope_scaling = {
      .type = RopeScalingType::kYarn, .factor = 4.0, .original_max_position_embeddings = 64};
  cases.push_back({"yarn_attention_factor",
                   [](BackendCapabilities& c) { c.yarn_attention_factor = false; }, yarn,
                   DType::kF32, absl::StatusCode::kInvalidArgument, "rope_scaling: yarn attention",
                   "factor"});
  cases.push_back({"kv_formats_plain", [](BackendCapabilities& c) { c.kv_formats = {DType::kF32}; },
                   Gqa(), DType::kBF16, absl::StatusCode::kInvalidArgument, "kv_cache_dtype = bf16",
                   "stores KV as f32"});
  cases.push_back({"kv_formats_8bit",
                   [](BackendCapabilities& c) {
                     c.kv_formats = {DType::kF32, DType::kBF16};
                   },
                   Gqa(), KvStorageFormat::Quantized(KvQuantization::kInt8),
                   absl::StatusCode::kUnimplemented, "kv_cache_quantization = int8",
                   "stores KV as f32, bf16"});
  return cases;
}

TEST(CapabilitiesTest, EachCapabilityOffRefusesByName) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(ValidateLayerSpec(c.spec).ok()) << ValidateLayerSpec(c.spec);
    // Served by the full table ...
    EXPECT_TRUE(CheckCapabilities(CpuCapabilities(), c.spec, Kv(c.kv)).ok());
    // ... and refused, by name, once the capability is off.
    BackendCapabilities off = CpuCapabilities();
    off.backend = "test";
    c.turn_off(off);
    const absl::Status status = CheckCapabilities(off, c.spec, Kv(c.kv));
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr(c.field), HasSubstr("the TEST backend"), HasSubstr(c.limit),
                      HasSubstr("CPU-only for now: use --backend=cpu")));
    const std::vector<CapabilityGap> gaps = FindCapabilityGaps(off, c.spec, c.kv);
    ASSERT_EQ(gaps.size(), 1u);
    EXPECT_EQ(gaps[0].status, status);
    EXPECT_FALSE(gaps[0].field.empty());
    EXPECT_FALSE(gaps[0].short_name.empty());
  }
}

// The variations are declared once (kernels/spec/attention_variation.h): each name once, the CPU
// table lists them all, a plain GQA spec uses none, and each case above turns one off.
TEST(CapabilitiesTest, VariationsAreDeclaredOnce) {
  std::vector<std::string> names;
  for (const NamedVariation& v : NamedVariations()) {
    EXPECT_EQ(std::count(names.begin(), names.end(), v.name), 0) << v.name;
    names.push_back(v.name);
    EXPECT_EQ(v.used(Gqa()), "") << v.name;
  }
  EXPECT_EQ(CpuCapabilities().variations, names);
  int turned_off = 0;
  for (const Case& c : Cases()) {
    BackendCapabilities off = CpuCapabilities();
    c.turn_off(off);
    turned_off += static_cast<int>(CpuCapabilities().variations.size() - off.variations.size());
  }
  EXPECT_EQ(turned_off, static_cast<int>(names.size()));
}

TEST(CapabilitiesTest, CpuServesEverySpecAndItsKvFormats) {
  std::vector<LayerSpec> specs = {Gqa(), Mla()};
  for (const Case& c : Cases()) specs.push_back(c.spec);
  LayerSpec everything = Gqa();
  everything.qk_norm = QkNorm::kRms;
  everything.rotary_dim = 32;
  everything.attn_logit_softcapping = 30.0f;
  everything.attention_sinks = true;
  everything.sliding_window = 8;
  everything.qkv_bias = everything.o_bias = true;
  everything.rope_scaling = {
      .type = RopeScalingType::kYarn, .factor = 8.0, .original_max_position_embeddings = 32};
  specs.push_back(everything);
  for (const LayerSpec& spec : specs) {
    SCOPED_TRACE(LayerSpecSummary(spec));
    ASSERT_TRUE(ValidateLayerSpec(spec).ok());
    for (const KvStorageFormat& format : CpuCapabilities().kv_formats) {
      EXPECT_TRUE(FindCapabilityGaps(CpuCapabilities(), spec, format).empty());
    }
  }
  // The one thing it does not store: f16 pages (bf16 is its 16-bit format).
  const absl::Status f16 = CheckCapabilities(CpuCapabilities(), Gqa(), Kv(DType::kF16));
  EXPECT_EQ(f16.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(f16.message(), HasSubstr("kv_cache_dtype = f16: the CPU backend stores KV as f32, "
                                       "bf16, fp8_e4m3, int8"));
  EXPECT_THAT(f16.message(), Not(HasSubstr("--backend=cpu")));
  for (LayerOperation op :
       {LayerOperation::kFork, LayerOperation::kExportImport, LayerOperation::kStack}) {
    EXPECT_TRUE(CheckOperation(CpuCapabilities(), op).ok());
  }
}

// The CUDA table against what its backend refused before the table (codes and fields kept).
TEST(CapabilitiesTest, CudaRefusesWhatItsKernelsDoNotDo) {
  const BackendCapabilities& cuda = CudaCapabilities();
  // MLA is served (kernels/cuda/layer/cuda_mla_layer.h) on every page format the GQA path takes,
  // 8-bit latent pages included (kernels/cuda/mla/mla_latent.cuh).
  for (const KvStorageFormat& format : cuda.kv_formats) {
    EXPECT_TRUE(CheckCapabilities(cuda, Mla(), Kv(format)).ok()) << KvStorageFormatName(format);
  }
  // 8-bit pages are served for MLA and for MHA/MQA/GQA (kernels/cuda/attention/kv_append.cuh).
  for (KvQuantization q : {KvQuantization::kFp8E4M3, KvQuantization::kInt8}) {
    EXPECT_TRUE(CheckCapabilities(cuda, Mla(), Kv(KvStorageFormat::Quantized(q))).ok());
    EXPECT_TRUE(CheckCapabilities(cuda, Gqa(), Kv(KvStorageFormat::Quantized(q))).ok());
  }
  LayerSpec hd32 = Gqa();
  hd32.head_dim = 32;
  const absl::Status head_dim = CheckCapabilities(cuda, hd32, Kv(DType::kF32));
  EXPECT_EQ(head_dim.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(head_dim.message(), HasSubstr("head_dim = 32: the CUDA backend is built for head "
                                            "dims 64, 128, 256"));
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int hd : {64, 128, 256}) {
      LayerSpec spec = Gqa();
      spec.head_dim = hd;
      spec.sliding_window = 40;
      EXPECT_TRUE(CheckCapabilities(cuda, spec, Kv(dtype)).ok()) << DTypeName(dtype) << " " << hd;
    }
  }
  // YaRN with mscale == mscale_all_dim has no attention factor: served.
  LayerSpec yarn = Gqa();
  yarn.rope_scaling = {.type = RopeScalingType::kYarn,
                       .factor = 4.0,
                       .original_max_position_embeddings = 64,
                       .mscale = 1.0,
                       .mscale_all_dim = 1.0};
  EXPECT_TRUE(CheckCapabilities(cuda, yarn, Kv(DType::kF32)).ok());
  // ... and so is YaRN with one (the RoPE kernel multiplies cos and sin by it).
  yarn.rope_scaling.mscale = 0.0;
  yarn.rope_scaling.mscale_all_dim = 0.0;
  EXPECT_TRUE(CheckCapabilities(cuda, yarn, Kv(DType::kF32)).ok());
  // The model-family variations are served (kernels/cuda/attention/variant_hooks.cuh).
  LayerSpec variations = Gqa();
  variations.head_dim = 256;
  variations.attn_logit_softcapping = 50.0f;
  variations.qk_norm = QkNorm::kRmsUnitOffset;
  variations.attention_sinks = true;
  variations.rotary_dim = 128;
  EXPECT_TRUE(CheckCapabilities(cuda, variations, Kv(DType::kBF16)).ok());
  // OLMo 2's norm over all heads of a token is not: the RoPE/append kernel norms one head per
  // block.
  LayerSpec olmo2 = Gqa();
  olmo2.qk_norm = QkNorm::kRmsAcrossHeads;
  const absl::Status across = CheckCapabilities(cuda, olmo2, Kv(DType::kF32));
  EXPECT_EQ(across.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(across.message(),
              AllOf(HasSubstr("qk_norm = rms_across_heads: the CUDA backend does not implement "
                              "q/k norm across heads (OLMo 2) yet"),
                    HasSubstr("--backend=cpu")));
  // Nor the per-head LayerNorm of StableLM 2 and Cohere: the kernel's norm is RMSNorm.
  LayerSpec cohere = Gqa();
  cohere.qk_norm = QkNorm::kLayerNorm;
  const absl::Status layer_norm = CheckCapabilities(cuda, cohere, Kv(DType::kF32));
  EXPECT_EQ(layer_norm.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layer_norm.message(),
              AllOf(HasSubstr("qk_norm = layer_norm: the CUDA backend does not implement q/k "
                              "LayerNorm (StableLM 2, Cohere) yet"),
                    HasSubstr("--backend=cpu")));
  // Every gap at once, in the fixed order.
  LayerSpec phi3 = Gqa();
  phi3.head_dim = 96;
  phi3.attn_logit_softcapping = 50.0f;
  std::vector<std::string> names;
  for (const CapabilityGap& gap :
       FindCapabilityGaps(cuda, phi3, KvStorageFormat::Quantized(KvQuantization::kFp8E4M3))) {
    names.push_back(gap.short_name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"hd 96"}));
}

TEST(CapabilitiesTest, OperationsOffAreUnimplementedNamingTheBackend) {
  // The CUDA backend serves every operation now; a table with them off still names itself.
  for (LayerOperation op :
       {LayerOperation::kFork, LayerOperation::kExportImport, LayerOperation::kStack}) {
    EXPECT_TRUE(CheckOperation(CudaCapabilities(), op).ok());
  }
  BackendCapabilities off = CudaCapabilities();
  off.fork = false;
  off.export_import = false;
  const absl::Status fork = CheckOperation(off, LayerOperation::kFork);
  EXPECT_EQ(fork.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(fork.message(), AllOf(HasSubstr("Fork: the CUDA backend does not fork"),
                                    HasSubstr("fork = false"), HasSubstr("--backend=cpu")));
  const absl::Status moving = CheckOperation(off, LayerOperation::kExportImport);
  EXPECT_EQ(moving.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(moving.message(), HasSubstr("export_import = false"));
  BackendCapabilities no_stacks = CpuCapabilities();
  no_stacks.stacks = false;
  EXPECT_EQ(CheckOperation(no_stacks, LayerOperation::kStack).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(UnservedOperation(LayerOperation::kFork).code(), absl::StatusCode::kUnimplemented);
}

// The CPU backend reports its table and refuses through it.
TEST(CapabilitiesTest, CpuBackendReportsAndChecksItsTable) {
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend({.num_threads = 1});
  ASSERT_TRUE(backend.ok());
  EXPECT_EQ(&(*backend)->capabilities(), &CpuCapabilities());
  EXPECT_EQ((*backend)->capabilities().backend, (*backend)->name());
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(Gqa(), 1);
  ASSERT_TRUE(weights.ok());
  const absl::Status f16 = (*backend)->CreateLayer(Gqa(), *weights, Kv(DType::kF16)).status();
  EXPECT_EQ(f16, CheckCapabilities(CpuCapabilities(), Gqa(), Kv(DType::kF16)));
}

}  // namespace
}  // namespace attnserve

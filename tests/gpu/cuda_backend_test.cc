// The CUDA backend against the CPU engine: every variant it serves (MHA, MQA, GQA with small and
// large groups, sliding window, non-causal, biases, both RoPE layouts, head dims 64, 128 and 256,
// and the model-family variations: q/k norm with w and 1 + w, partial rotary, logit soft-cap,
// attention sinks, BLOOM's and MPT's ALiBi) x KV dtype (f32, bf16, f16, with matching hidden
// dtype) x phase (prefill, decode).
//
// Each case draws fresh random weights and inputs (the seed is printed), runs the same calls on
// both engines and compares every call's output by ||gpu - cpu|| / ||cpu||. The GPU backend runs
// with poison_for_testing: its pool and every new page are NaN before K/V are written and its
// workspace outputs are NaN before each call, so an unread-but-used slot or an unwritten output
// becomes NaN and fails (NaN never passes a bound). Lengths cross the page (16, and 5 in one
// case), key-tile (16/32 on CUDA cores, 64 on tensor cores), query-tile (16 rows; 64 rows and
// 16-row warps on tensor cores) and window (40) edges; batches are ragged; one sequence is long
// enough for split-KV decode.
//
// Tolerances (relative 2-norm, per call). With f16/bf16 pages the GPU computes in that dtype
// (weights, activations, Q and P rounded for tensor-core GEMMs and mma, fp32 accumulation) while
// the CPU engine computes in fp32, and both round K/V and the output from different fp32 values:
// about a dozen independent roundings of u/sqrt(3) each meet in the output, ~3.5u in the worst
// call of a case. Seen on the emulated device (tests/gpu/emulated: these kernels and this host
// code on the CPU), worst call over every case: f32 8e-7, bf16 6.3e-3, f16 7.3e-4.
//   f32 KV, f32 I/O:   1e-4    both fp32; cuBLAS vs OpenBLAS and different summation orders.
//   bf16 KV, bf16 I/O: 1.6e-2  4u, u = 2^-8. The CPU engine also caches bf16.
//   f16 KV, f16 I/O:   4e-3    8u, u = 2^-11; the CPU engine has no f16 cache and keeps f32 K/V.
//   fp8 / int8 KV, f32 I/O: 1e-2  both engines compute in fp32 and quantize the same K/V with the
//                       same arithmetic (kernels/kv/kv_codes.h): the pages agree byte for byte
//                       unless cuBLAS's and OpenBLAS's fp32 K/V differ across a rounding edge of a
//                       code (one step: 2^-4 relative for fp8, a scale/127 for int8) or of a
//                       power-of-two scale; seen on the emulated device: about 1e-6.
// Without a usable CUDA device every test SKIPS with the reason. A summary table is printed after
// all tests. The same file is also built against the emulated device (tests/gpu/emulated:
// cuda_backend_emulated_test), where it runs in CI on the CPU.
#include "kernels/cuda/runtime/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/capabilities.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/cuda_capabilities.h"
#include "kernels/cuda/layer/cuda_layer.h"
#include "kernels/cuda/layer/stage_timer.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kv/page_layout.h"
#include "kernels/kv/quantization.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/model/layer_weights.h"
#include "kernels/stack/layer_stack.h"
#include "tests/reference/attention_reference.h"

namespace attnserve {
namespace {

using reference::RandomHidden;
using reference::RelativeError;
using reference::ToDoubles;
using reference::ToTensor;

struct SummaryRow {
  std::string name;
  std::string kv;
  std::string impl;  // --cuda_attention: native or flashinfer.
  std::string phase;
  int calls = 0;
  double worst = 0.0;
  double bound = 0.0;
};

std::vector<SummaryRow>& Summary() {
  static auto* rows = new std::vector<SummaryRow>();
  return *rows;
}

// One backend per attention implementation for the whole binary (its pool is allocated once);
// null with the reason when there is no usable device.
struct GpuBackend {
  std::unique_ptr<AttentionBackend> backend;
  std::string why_not;
};

GpuBackend* MakeGpu(CudaAttentionImpl impl) {
  auto* g = new GpuBackend;
  CudaBackendOptions options;
  options.kv_pool_bytes = int64_t{1} << 30;
  options.poison_for_testing = true;
  options.attention = impl;
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCudaBackend(options);
  if (backend.ok()) {
    g->backend = std::move(*backend);
    std::printf("[cuda] %s\n", g->backend->device_description().c_str());
  } else {
    g->why_not = backend.status().ToString();
  }
  return g;
}

GpuBackend& Gpu(CudaAttentionImpl impl = CudaAttentionImpl::kNative) {
  static GpuBackend* native = MakeGpu(CudaAttentionImpl::kNative);
  if (impl == CudaAttentionImpl::kNative) return *native;
  static GpuBackend* flashinfer = MakeGpu(CudaAttentionImpl::kFlashInfer);
  return *flashinfer;
}

// The implementations the CUDA-vs-CPU cases run under: FlashInfer where this build has it and the
// device is real (FlashInfer's kernels cannot run on the emulated device).
std::vector<CudaAttentionImpl> Implementations() {
  std::vector<CudaAttentionImpl> impls = {CudaAttentionImpl::kNative};
#if !defined(ATTNSERVE_EMULATED_DEVICE)
  if (FlashInferBuilt()) impls.push_back(CudaAttentionImpl::kFlashInfer);
#endif
  return impls;
}

#if defined(ATTNSERVE_EMULATED_DEVICE)
// The emulated device is always there: not finding it is a failure, never a skip.
#define SKIP_WITHOUT_GPU()                                                                     \
  if (Gpu().backend == nullptr) {                                                              \
    GTEST_FAIL() << "the emulated device (tests/gpu/emulated) is unusable: " << Gpu().why_not; \
  }
#else
#define SKIP_WITHOUT_GPU()                                                          \
  if (Gpu().backend == nullptr) {                                                   \
    GTEST_SKIP() << "no usable CUDA device, GPU checks skipped: " << Gpu().why_not; \
  }
#endif

struct GpuCase {
  std::string name;
  LayerSpec spec;
  int page_size = 16;
};

LayerSpec Spec(int heads, int kv_heads, int head_dim, RopeLayout rope) {
  LayerSpec spec;
  spec.variant = kv_heads == heads ? AttentionVariant::kMHA
                 : kv_heads == 1   ? AttentionVariant::kMQA
                                   : AttentionVariant::kGQA;
  spec.d_model = 256;
  spec.num_heads = heads;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = head_dim;
  spec.rope = rope;
  return spec;
}

std::vector<GpuCase> Cases() {
  std::vector<GpuCase> cases;
  cases.push_back({"mha_hd64_half", Spec(4, 4, 64, RopeLayout::kHalf)});
  {
    LayerSpec s = Spec(4, 4, 128, RopeLayout::kInterleaved);
    s.qkv_bias = s.o_bias = true;
    cases.push_back({"mha_hd128_interleaved_bias", s});
  }
  cases.push_back({"gqa4x2_hd128_half", Spec(8, 2, 128, RopeLayout::kHalf)});
  cases.push_back({"mqa8_hd64_norope_page5", Spec(8, 1, 64, RopeLayout::kNone), 5});
  // Group of 32 > 16 rows per block: decode splits the group over grid.z.
  cases.push_back({"mqa32_hd64_half", Spec(32, 1, 64, RopeLayout::kHalf)});
  {
    LayerSpec s = Spec(8, 2, 64, RopeLayout::kHalf);
    s.sliding_window = 40;
    cases.push_back({"gqa_window40_hd64", s});
  }
  {
    LayerSpec s = Spec(4, 4, 64, RopeLayout::kHalf);
    s.causal = false;
    s.softmax_scale = 0.05f;
    cases.push_back({"mha_noncausal_scale_hd64", s});
  }
  {
    // Llama 3.1 rope scaling: the kernel takes the CPU's scaled per-pair frequencies.
    LayerSpec s = Spec(8, 2, 64, RopeLayout::kHalf);
    s.rope_theta = 500000.0;
    s.rope_scaling = {.type = RopeScalingType::kLlama3,
                      .factor = 8.0,
                      .original_max_position_embeddings = 64,
                      .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0};
    cases.push_back({"gqa_llama3_scaling_hd64", s});
  }
  {
    // YaRN with mscale == mscale_all_dim (DeepSeek-V3's): attention factor 1, frequencies ramped.
    LayerSpec s = Spec(4, 4, 64, RopeLayout::kInterleaved);
    s.rope_scaling = {.type = RopeScalingType::kYarn,
                      .factor = 40.0,
                      .original_max_position_embeddings = 64,
                      .mscale = 1.0,
                      .mscale_all_dim = 1.0};
    cases.push_back({"mha_yarn_scaling_hd64", s});
  }
  // The model-family variations (kernels/cuda/attention/variant_hooks.cuh). VividVariantWeights
  // redraws their weights so that each one moves the output.
  {
    LayerSpec s = Spec(4, 2, 128, RopeLayout::kHalf);  // Qwen3: RMSNorm(q), RMSNorm(k) with w.
    s.qk_norm = QkNorm::kRms;
    cases.push_back({"gqa_qwen3_qknorm_hd128", s});
  }
  {
    LayerSpec s = Spec(4, 4, 64, RopeLayout::kHalf);  // Phi-3: 48 of 64 dims rotate.
    s.rotary_dim = 48;
    cases.push_back({"mha_phi3_partial_rotary48_hd64", s});
  }
  {
    // Gemma 2's soft-cap, small enough (scaled scores reach about 2) that tanh bends them; on
    // tensor cores for 16-bit pages.
    LayerSpec s = Spec(8, 4, 64, RopeLayout::kHalf);
    s.attn_logit_softcapping = 1.0f;
    s.softmax_scale = 0.5f;
    cases.push_back({"gqa_gemma2_softcap_hd64", s});
  }
  {
    // gpt-oss: sinks, biases and YaRN without mscale (cos and sin times 0.1 ln(4) + 1). No window,
    // so the 600-key sequence decodes in several splits (the sink joins in the combine).
    LayerSpec s = Spec(8, 2, 64, RopeLayout::kHalf);
    s.attention_sinks = true;
    s.qkv_bias = s.o_bias = true;
    s.rope_scaling = {.type = RopeScalingType::kYarn,
                      .factor = 4.0,
                      .original_max_position_embeddings = 64};
    cases.push_back({"gqa_gptoss_sinks_yarn_bias_hd64", s});
  }
  {
    // Gemma 3 style at head dim 256 (CUDA-core prefill for every page type): q/k norm with 1 + w,
    // a soft-cap and a sliding window.
    LayerSpec s = Spec(4, 2, 256, RopeLayout::kHalf);
    s.qk_norm = QkNorm::kRmsUnitOffset;
    s.attn_logit_softcapping = 1.0f;
    s.softmax_scale = 0.25f;
    s.sliding_window = 40;
    cases.push_back({"gqa_gemma3_qknorm1p_softcap_window_hd256", s});
  }
  {
    // BLOOM: ALiBi without RoPE, biases, 12 heads (not a power of two: heads 8-11 take the second
    // slope series) in groups of 3, so the slope is per query head, not per KV head.
    LayerSpec s = Spec(12, 4, 64, RopeLayout::kNone);
    s.alibi = Alibi::kBloom;
    s.qkv_bias = s.o_bias = true;
    cases.push_back({"gqa_bloom_alibi_hd64", s});
  }
  {
    // MPT: ALiBi with 6 heads (n = 8: odd slopes first) and a shallow alibi_bias_max (slopes 2^-0.5
    // to 2^-4) so keys across the 40-token window and several tiles keep weight; head dim 128.
    LayerSpec s = Spec(6, 6, 128, RopeLayout::kNone);
    s.alibi = Alibi::kMpt;
    s.alibi_bias_max = 4.0f;
    s.sliding_window = 40;
    cases.push_back({"mha_mpt_alibi_window40_hd128", s});
  }
  return cases;
}

// RandomLayerWeights sets every norm scale to its init (w = 1, or 0 for 1 + w), which would hide a
// misindexed or dropped scale, and draws sinks in [-1, 1], small next to hundreds of keys: redraw
// the norm scales around their init (+-0.5) and the sinks in [-2, 6] so each variation shows.
void VividVariantWeights(const LayerSpec& spec, uint64_t seed, LayerWeights& weights) {
  std::mt19937_64 rng(seed ^ 0x5EEDu);
  auto redraw = [&](const char* name, float lo, float hi) {
    auto it = weights.find(name);
    if (it == weights.end()) return;
    std::uniform_real_distribution<float> uniform(lo, hi);
    float* values = it->second.f32();
    for (int64_t i = 0; i < it->second.num_elements(); ++i) values[i] = uniform(rng);
  };
  const float offset = spec.qk_norm == QkNorm::kRmsUnitOffset ? 0.0f : 1.0f;
  redraw("q_norm.weight", offset - 0.5f, offset + 0.5f);
  redraw("k_norm.weight", offset - 0.5f, offset + 0.5f);
  redraw("sinks", -2.0f, 6.0f);
}

struct DtypeCase {
  KvStorageFormat kv;
  DType io;
  KvStorageFormat cpu_kv;
  double bound;
};

const DtypeCase kDtypes[] = {
    {DType::kF32, DType::kF32, DType::kF32, 1e-4},
    {DType::kBF16, DType::kBF16, DType::kBF16, 1.6e-2},
    {DType::kF16, DType::kF16, DType::kF32, 4e-3},
};

// 8-bit pages (CUDA-core kernels, fp32 projections) on two cases: head dims 64 and 256, an odd
// page size (5), MQA and GQA, window, soft-cap and q/k norm (AllVariants8Bit: same sweep label;
// the append and the dequantizing gather do not depend on the head dim).
const DtypeCase k8BitDtypes[] = {
    {KvStorageFormat::Quantized(KvQuantization::kFp8E4M3), DType::kF32,
     KvStorageFormat::Quantized(KvQuantization::kFp8E4M3), 1e-2},
    {KvStorageFormat::Quantized(KvQuantization::kInt8), DType::kF32,
     KvStorageFormat::Quantized(KvQuantization::kInt8), 1e-2},
};

std::vector<GpuCase> EightBitCases() {
  std::vector<GpuCase> cases;
  for (const GpuCase& c : Cases()) {
    if (c.name == "mqa8_hd64_norope_page5" ||
        c.name == "gqa_gemma3_qknorm1p_softcap_window_hd256") {
      cases.push_back(c);
    }
  }
  return cases;
}

void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.name; }
void PrintTo(const DtypeCase& d, std::ostream* os) { *os << KvStorageFormatName(d.kv); }

class CudaVsCpuTest
    : public ::testing::TestWithParam<std::tuple<GpuCase, DtypeCase, CudaAttentionImpl>> {};

TEST_P(CudaVsCpuTest, PrefillAndDecodeMatchCpu) {
  SKIP_WITHOUT_GPU();
  const GpuCase& c = std::get<0>(GetParam());
  const DtypeCase& dt = std::get<1>(GetParam());
  const CudaAttentionImpl impl = std::get<2>(GetParam());
  if (impl == CudaAttentionImpl::kFlashInfer && (dt.kv == DType::kF32 || dt.kv.quantized())) {
    GTEST_SKIP() << "f32 and 8-bit pages run the native kernels under either implementation";
  }
  GpuBackend& backend = Gpu(impl);
  if (backend.backend == nullptr) GTEST_FAIL() << backend.why_not;
  const std::string impl_name = CudaAttentionImplName(impl);
  const uint64_t seed =
      std::random_device{}() * uint64_t{0x9E3779B97F4A7C15} ^ std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::printf("[case] %s kv=%s impl=%s seed=%" PRIu64 "\n", c.name.c_str(),
              KvStorageFormatName(dt.kv).c_str(), impl_name.c_str(), seed);
  std::mt19937_64 rng(seed);
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(c.spec, seed);
  ASSERT_TRUE(weights.ok()) << weights.status();
  VividVariantWeights(c.spec, seed, *weights);
  absl::StatusOr<std::unique_ptr<AttentionBackend>> cpu_backend = CreateCpuBackend();
  ASSERT_TRUE(cpu_backend.ok());
  KvCacheConfig gpu_config{dt.kv, c.page_size, 4096, nullptr};
  KvCacheConfig cpu_config{dt.cpu_kv, c.page_size, 4096, nullptr};
  absl::StatusOr<std::unique_ptr<AttentionLayer>> gpu =
      backend.backend->CreateLayer(c.spec, *weights, gpu_config);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<AttentionLayer>> cpu =
      (*cpu_backend)->CreateLayer(c.spec, *weights, cpu_config);
  ASSERT_TRUE(cpu.ok()) << cpu.status();

  // Ragged lengths crossing pages (16, 5), key tiles (16/32), query tiles (16 rows), the window
  // (40), and one sequence long enough (600 keys) for several decode splits.
  const std::vector<int64_t> first = {1, 37, 70, 600};
  const std::vector<int64_t> second = {17, 1, 33, 2};
  std::vector<SequenceId> gpu_ids, cpu_ids;
  for (size_t i = 0; i < first.size(); ++i) {
    gpu_ids.push_back((*gpu)->CreateSequence());
    cpu_ids.push_back((*cpu)->CreateSequence());
  }
  SummaryRow prefill{c.name, KvStorageFormatName(dt.kv), impl_name, "prefill", 0, 0.0, dt.bound};
  SummaryRow decode{c.name, KvStorageFormatName(dt.kv), impl_name, "decode", 0, 0.0, dt.bound};
  auto compare = [&](const Tensor& g, const Tensor& r, SummaryRow& row, const std::string& what) {
    const double err = RelativeError(ToDoubles(g), ToDoubles(r));
    ++row.calls;
    row.worst = std::isnan(err) || std::isnan(row.worst) ? NAN : std::max(row.worst, err);
    EXPECT_LE(err, dt.bound) << what;  // NaN fails.
  };
  const int d = c.spec.d_model;
  // Two prefill calls per sequence (the second continues the cache), the second with explicit
  // positions offset by 1000 for sequence 0.
  for (int call = 0; call < 2; ++call) {
    const std::vector<int64_t>& counts = call == 0 ? first : second;
    std::vector<PrefillChunk> gpu_chunks, cpu_chunks;
    int64_t rows = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      gpu_chunks.push_back({gpu_ids[i], counts[i]});
      cpu_chunks.push_back({cpu_ids[i], counts[i]});
      rows += counts[i];
    }
    const Tensor hidden = ToTensor(RandomHidden(rows, d, rng), {rows, d}, dt.io);
    std::vector<int64_t> positions;
    if (call == 1) {
      for (size_t i = 0; i < counts.size(); ++i) {
        const int64_t start = first[i] + (i == 0 ? 1000 : 0);
        for (int64_t t = 0; t < counts[i]; ++t) positions.push_back(start + t);
      }
    }
    absl::StatusOr<Tensor> g = (*gpu)->Prefill(gpu_chunks, hidden, positions);
    absl::StatusOr<Tensor> r = (*cpu)->Prefill(cpu_chunks, hidden, positions);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(g->dtype(), dt.io);
    compare(*g, *r, prefill, absl::StrCat("prefill call ", call));
  }
  // Decode: 24 steps of the whole batch (crosses a page and the window edge), then 5 steps of a
  // sub-batch in another order.
  for (int step = 0; step < 29; ++step) {
    std::vector<size_t> which = {0, 1, 2, 3};
    if (step >= 24) which = {3, 0};
    std::vector<SequenceId> g_ids, c_ids;
    for (size_t i : which) {
      g_ids.push_back(gpu_ids[i]);
      c_ids.push_back(cpu_ids[i]);
    }
    const int64_t rows = static_cast<int64_t>(which.size());
    const Tensor hidden = ToTensor(RandomHidden(rows, d, rng), {rows, d}, dt.io);
    absl::StatusOr<Tensor> g = (*gpu)->Decode(g_ids, hidden, {});
    absl::StatusOr<Tensor> r = (*cpu)->Decode(c_ids, hidden, {});
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(r.ok()) << r.status();
    compare(*g, *r, decode, absl::StrCat("decode step ", step));
  }
  // Same reservation and eviction logic (KvSequenceTable): the same pages in use.
  EXPECT_EQ((*gpu)->PoolUsage().used_pages, (*cpu)->PoolUsage().used_pages);
  for (size_t i = 0; i < gpu_ids.size(); ++i) {
    EXPECT_EQ(*(*gpu)->SequenceLength(gpu_ids[i]), *(*cpu)->SequenceLength(cpu_ids[i]));
    ASSERT_TRUE((*gpu)->ReleaseSequence(gpu_ids[i]).ok());
  }
  EXPECT_EQ((*gpu)->PoolUsage().used_pages, 0);
  Summary().push_back(prefill);
  Summary().push_back(decode);
}

std::string CaseName(
    const ::testing::TestParamInfo<std::tuple<GpuCase, DtypeCase, CudaAttentionImpl>>& info) {
  return absl::StrCat(std::get<0>(info.param).name, "_",
                      KvStorageFormatName(std::get<1>(info.param).kv),
                      "_", CudaAttentionImplName(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(AllVariants, CudaVsCpuTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()),
                                            ::testing::ValuesIn(kDtypes),
                                            ::testing::ValuesIn(Implementations())),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(AllVariants8Bit, CudaVsCpuTest,
                         ::testing::Combine(::testing::ValuesIn(EightBitCases()),
                                            ::testing::ValuesIn(k8BitDtypes),
                                            ::testing::Values(CudaAttentionImpl::kNative)),
                         CaseName);

// MLA is served (kernels/cuda/layer/cuda_mla_layer.h; its CUDA-vs-CPU cases: cuda_mla_test.cc).
TEST(CudaBackendContractTest, MlaIsServed) {
  SKIP_WITHOUT_GPU();
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
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 1);
  ASSERT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
      Gpu().backend->CreateLayer(spec, *weights, {DType::kBF16, 0, 64, nullptr});
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ((*layer)->kv_config().page_size, 64) << "MLA's default page size, as on the CPU";
}

TEST(CudaBackendContractTest, UnsupportedHeadDimIsInvalidArgument) {
  SKIP_WITHOUT_GPU();
  const LayerSpec spec = Spec(4, 4, 32, RopeLayout::kHalf);
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 1);
  ASSERT_TRUE(weights.ok());
  EXPECT_EQ(
      Gpu().backend->CreateLayer(spec, *weights, {DType::kF32, 16, 64, nullptr}).status().code(),
      absl::StatusCode::kInvalidArgument);
}

// The backend reports its capability table (kernels/cuda/cuda_capabilities.h) and every refusal
// of CreateLayer is the table's check, word for word.
TEST(CudaBackendContractTest, RefusalsComeFromTheCapabilityTable) {
  SKIP_WITHOUT_GPU();
  AttentionBackend& gpu = *Gpu().backend;
  EXPECT_EQ(&gpu.capabilities(), &CudaCapabilities());
  EXPECT_EQ(gpu.capabilities().backend, gpu.name());
  std::vector<std::pair<LayerSpec, KvStorageFormat>> refused;
  refused.push_back({Spec(4, 2, 96, RopeLayout::kHalf), DType::kF32});
  refused.push_back({Spec(4, 2, 512, RopeLayout::kHalf), DType::kBF16});
  refused.push_back(
      {Spec(4, 2, 96, RopeLayout::kHalf), KvStorageFormat::Quantized(KvQuantization::kInt8)});
  for (const auto& [spec, format] : refused) {
    SCOPED_TRACE(LayerSpecSummary(spec));
    absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 1);
    ASSERT_TRUE(weights.ok()) << weights.status();
    const KvCacheConfig config{format, 16, 64, nullptr};
    const absl::Status expected = CheckCapabilities(CudaCapabilities(), spec, config);
    ASSERT_FALSE(expected.ok());
    EXPECT_EQ(gpu.CreateLayer(spec, *weights, config).status(), expected);
  }
}

// The table's head dims and KV formats are the kernels' instantiations (attention/dispatch.cc):
// the table neither promises a kernel that is not built nor hides one that is.
TEST(CudaBackendContractTest, TableMatchesTheKernelInstantiations) {
  const BackendCapabilities& table = CudaCapabilities();
  for (const KvStorageFormat& format : table.kv_formats) {
    for (int head_dim = 8; head_dim <= 512; head_dim += 8) {
      const bool listed = std::find(table.head_dims.begin(), table.head_dims.end(), head_dim) !=
                          table.head_dims.end();
      EXPECT_EQ(cuda::CheckAttentionSupported(format, head_dim).ok(), listed)
          << KvStorageFormatName(format) << " head_dim " << head_dim;
    }
  }
}

// What the table declares about stacks: stacks of CUDA layers compute what stacks of CPU layers do.
TEST(CudaBackendContractTest, StacksComputeAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  LayerSpec window = Spec(4, 2, 64, RopeLayout::kHalf);
  window.sliding_window = 8;
  const std::vector<LayerSpec> specs = {window, Spec(4, 2, 64, RopeLayout::kInterleaved)};
  std::vector<LayerWeights> weights;
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::StatusOr<LayerWeights> w = RandomLayerWeights(specs[i], 11 + i);
    ASSERT_TRUE(w.ok());
    weights.push_back(*std::move(w));
  }
  absl::StatusOr<std::unique_ptr<AttentionBackend>> cpu_backend = CreateCpuBackend();
  ASSERT_TRUE(cpu_backend.ok());
  const KvCacheConfig config{DType::kF32, 16, 64, nullptr};
  absl::StatusOr<std::unique_ptr<LayerStack>> gpu =
      LayerStack::Create(*Gpu().backend, specs, weights, config);
  absl::StatusOr<std::unique_ptr<LayerStack>> cpu =
      LayerStack::Create(**cpu_backend, specs, weights, config);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const SequenceId g = (*gpu)->CreateSequence(), c = (*cpu)->CreateSequence();
  std::mt19937_64 rng(13);
  const Tensor prompt = ToTensor(RandomHidden(20, 256, rng), {20, 256}, DType::kF32);
  absl::StatusOr<Tensor> got = (*gpu)->Prefill({{g, 20}}, prompt, {});
  absl::StatusOr<Tensor> want = (*cpu)->Prefill({{c, 20}}, prompt, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_LE(RelativeError(ToDoubles(*got), ToDoubles(*want)), 1e-4);
  const Tensor step = ToTensor(RandomHidden(1, 256, rng), {1, 256}, DType::kF32);
  got = (*gpu)->Decode({g}, step, {});
  want = (*cpu)->Decode({c}, step, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok());
  EXPECT_LE(RelativeError(ToDoubles(*got), ToDoubles(*want)), 1e-4);
  EXPECT_TRUE(CudaCapabilities().stacks);
}

// Fork, ExportSequence and ImportSequence: what they copy and what they share (KvSequenceTable,
// the same as the CPU layer's), and the bytes they move. Inputs in the page dtype, as the sweep.
constexpr int kTransferWindow = 24;  // With pages of 16: prompts past 39 tokens evict page 0.

Tensor Hidden(int64_t rows, DType dtype, std::mt19937_64& rng) {
  return ToTensor(RandomHidden(rows, 256, rng), {rows, 256}, dtype);
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.num_bytes()) == 0;
}

// The sweep's CUDA-vs-CPU bounds for these page dtypes (the file's header).
double CpuBound(DType dtype) { return dtype == DType::kF32 ? 1e-4 : 1.6e-2; }

// Forks share the source's full pages and copy its ragged last page; each child then decodes, bit
// for bit, as a sequence prefilled with the same call and fed the same tokens (the CPU's
// kv_fork_test expectation), through another page boundary and another sliding-window eviction,
// while the source's pages stay as they were. Refusals take nothing; releasing everything
// empties the pool.
TEST(CudaBackendContractTest, ForkedChildrenDecodeAsUnforkedSequences) {
  SKIP_WITHOUT_GPU();
  for (bool window : {false, true}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), window ? " window" : ""));
      LayerSpec spec = Spec(4, 2, 64, RopeLayout::kHalf);
      if (window) spec.sliding_window = kTransferWindow;
      absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 31);
      ASSERT_TRUE(weights.ok());
      auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
      absl::StatusOr<std::unique_ptr<AttentionLayer>> made =
          Gpu().backend->CreateLayer(spec, *weights, {dtype, 16, 64, budget});
      ASSERT_TRUE(made.ok()) << made.status();
      AttentionLayer& layer = **made;
      std::mt19937_64 rng(17);
      const Tensor prompt = Hidden(45, dtype, rng);  // 2 full pages and 13 tokens.
      const SequenceId source = layer.CreateSequence();
      SequenceId twin[2];
      for (SequenceId& id : twin) id = layer.CreateSequence();
      for (SequenceId id : {source, twin[0], twin[1]}) {
        ASSERT_TRUE(layer.Prefill({{id, 45}}, prompt, {}).ok());
      }
      const int64_t held = window ? 2 : 3;  // The window left page 0 behind.
      ASSERT_EQ(layer.PoolUsage().used_pages, 3 * held);
      const int64_t budget_before = budget->used_bytes();

      EXPECT_EQ(layer.ForkSequence(12345, 2).status().code(), absl::StatusCode::kNotFound);
      EXPECT_EQ(layer.ForkSequence(source, 0).status().code(),
                absl::StatusCode::kInvalidArgument);
      // 64 pages, 6 held: 59 copies of the last page do not fit, and nothing is taken.
      EXPECT_EQ(layer.ForkSequence(source, 59).status().code(),
                absl::StatusCode::kResourceExhausted);
      EXPECT_EQ(layer.PoolUsage().used_pages, 3 * held);
      EXPECT_EQ(budget->used_bytes(), budget_before);

      absl::StatusOr<SequenceExport> source_pages = layer.ExportSequence(source);
      ASSERT_TRUE(source_pages.ok()) << source_pages.status();
      absl::StatusOr<std::vector<SequenceId>> forks = layer.ForkSequence(source, 2);
      ASSERT_TRUE(forks.ok()) << forks.status();
      ASSERT_EQ(forks->size(), 2u);
      const int64_t page_bytes = layer.PoolUsage().page_bytes;
      EXPECT_EQ(layer.PoolUsage().used_pages, 3 * held + 2) << "one copy of the ragged page each";
      EXPECT_EQ(budget->used_bytes(), budget_before + 2 * page_bytes);
      for (SequenceId child : *forks) {
        EXPECT_EQ(layer.SequenceLength(child).value_or(-1), 45);
        EXPECT_EQ(layer.SequenceKvBytes(child).value_or(-1), held * page_bytes);
        absl::StatusOr<SequenceExport> child_pages = layer.ExportSequence(child);
        ASSERT_TRUE(child_pages.ok());
        EXPECT_EQ(child_pages->first_held_page, source_pages->first_held_page);
        EXPECT_TRUE(child_pages->pages == source_pages->pages) << "the copy is the page verbatim";
      }

      // The children and their twins in batches of the same shape, each with its own inputs.
      const std::vector<SequenceId> children = *forks, twins = {twin[0], twin[1]};
      for (int step = 0; step < 11; ++step) {  // 45 -> 56 tokens: page 3 opens, page 1 evicted.
        SCOPED_TRACE(absl::StrCat("step ", step));
        const Tensor x = Hidden(2, dtype, rng);
        absl::StatusOr<Tensor> got = layer.Decode(children, x, {});
        absl::StatusOr<Tensor> want = layer.Decode(twins, x, {});
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_TRUE(want.ok()) << want.status();
        ASSERT_TRUE(SameBits(*got, *want)) << "a forked child decoded differently";
      }
      absl::StatusOr<SequenceExport> source_after = layer.ExportSequence(source);
      ASSERT_TRUE(source_after.ok());
      EXPECT_EQ(source_after->num_tokens, 45);
      EXPECT_TRUE(source_after->pages == source_pages->pages) << "the children wrote the source";
      for (SequenceId id : {source, twin[0], twin[1], children[0], children[1]}) {
        ASSERT_TRUE(layer.ReleaseSequence(id).ok());
      }
      EXPECT_EQ(layer.PoolUsage().used_pages, 0);
      EXPECT_EQ(budget->used_bytes(), 0);

      // A full last page is shared like the others: nothing copied.
      const SequenceId full = layer.CreateSequence();
      ASSERT_TRUE(layer.Prefill({{full, 32}}, Hidden(32, dtype, rng), {}).ok());
      const int64_t full_pages = layer.PoolUsage().used_pages;
      absl::StatusOr<std::vector<SequenceId>> shared = layer.ForkSequence(full, 3);
      ASSERT_TRUE(shared.ok()) << shared.status();
      EXPECT_EQ(layer.PoolUsage().used_pages, full_pages);
      ASSERT_TRUE(layer.ReleaseSequence(full).ok());
      EXPECT_EQ(layer.PoolUsage().used_pages, full_pages) << "the forks still hold the pages";
      for (SequenceId id : *shared) ASSERT_TRUE(layer.ReleaseSequence(id).ok());
      EXPECT_EQ(layer.PoolUsage().used_pages, 0);
    }
  }
}

// A request moves between CPU and CUDA layers of the same spec, storage format and page size in
// either direction (one byte format: the pages verbatim), with the window's evicted leading page
// and the ragged last page: the bytes survive both ways unchanged, a GPU -> GPU move decodes bit
// for bit as the sequence that stayed, and the moved sequences decode on the other engine within
// the sweep's bounds, past another page boundary and eviction. Mismatched exports are refused and
// take nothing.
TEST(CudaBackendContractTest, ExportImportMovesSequencesBetweenCpuAndGpu) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<AttentionBackend>> cpu_backend = CreateCpuBackend();
  ASSERT_TRUE(cpu_backend.ok());
  LayerSpec spec = Spec(4, 2, 64, RopeLayout::kHalf);
  spec.sliding_window = kTransferWindow;
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 37);
  ASSERT_TRUE(weights.ok());
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
    const KvCacheConfig config{dtype, 16, 64, budget};
    absl::StatusOr<std::unique_ptr<AttentionLayer>> gpu_made =
        Gpu().backend->CreateLayer(spec, *weights, config);
    absl::StatusOr<std::unique_ptr<AttentionLayer>> cpu_made =
        (*cpu_backend)->CreateLayer(spec, *weights, {dtype, 16, 64, nullptr});
    ASSERT_TRUE(gpu_made.ok()) << gpu_made.status();
    ASSERT_TRUE(cpu_made.ok()) << cpu_made.status();
    AttentionLayer& gpu = **gpu_made;
    AttentionLayer& cpu = **cpu_made;
    ASSERT_EQ(gpu.PoolUsage().page_bytes, cpu.PoolUsage().page_bytes);
    std::mt19937_64 rng(19);
    const Tensor prompt = Hidden(45, dtype, rng);
    const SequenceId g = gpu.CreateSequence(), c = cpu.CreateSequence();
    ASSERT_TRUE(gpu.Prefill({{g, 45}}, prompt, {}).ok());
    ASSERT_TRUE(cpu.Prefill({{c, 45}}, prompt, {}).ok());

    absl::StatusOr<SequenceExport> from_gpu = gpu.ExportSequence(g);
    absl::StatusOr<SequenceExport> from_cpu = cpu.ExportSequence(c);
    ASSERT_TRUE(from_gpu.ok()) << from_gpu.status();
    ASSERT_TRUE(from_cpu.ok()) << from_cpu.status();
    const int64_t page_bytes = gpu.PoolUsage().page_bytes;
    EXPECT_EQ(from_gpu->num_tokens, 45);
    EXPECT_EQ(from_gpu->first_held_page, 1) << "the window evicted page 0";
    EXPECT_EQ(from_gpu->page_bytes, page_bytes);
    EXPECT_EQ(static_cast<int64_t>(from_gpu->pages.size()), 2 * page_bytes);
    EXPECT_EQ(gpu.SequenceLength(g).value_or(-1), 45) << "export leaves the source as is";
    EXPECT_EQ(from_cpu->first_held_page, from_gpu->first_held_page);

    // Refusals, each taking nothing: a CPU f32 export into a bf16 layer (other page_bytes), bytes
    // missing, a leading page the window still needs.
    const int64_t used = gpu.PoolUsage().used_pages, charged = budget->used_bytes();
    {
      absl::StatusOr<std::unique_ptr<AttentionLayer>> other = Gpu().backend->CreateLayer(
          spec, *weights, {dtype == DType::kF32 ? DType::kBF16 : DType::kF32, 16, 64, nullptr});
      ASSERT_TRUE(other.ok());
      const absl::Status format = (*other)->ImportSequence(*from_cpu).status();
      EXPECT_EQ(format.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(format.message().find("page_bytes = "), absl::string_view::npos) << format;
      EXPECT_EQ((*other)->PoolUsage().used_pages, 0);
    }
    SequenceExport short_bytes = *from_cpu;
    short_bytes.pages.pop_back();
    const absl::Status short_status = gpu.ImportSequence(short_bytes).status();
    EXPECT_EQ(short_status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(short_status.message().find("expected 2 held pages"), absl::string_view::npos)
        << short_status;
    SequenceExport too_evicted = *from_cpu;
    too_evicted.first_held_page = 2;
    too_evicted.pages.erase(0, static_cast<size_t>(page_bytes));
    EXPECT_EQ(gpu.ImportSequence(too_evicted).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(gpu.PoolUsage().used_pages, used);
    EXPECT_EQ(budget->used_bytes(), charged);

    // CPU -> GPU and GPU -> CPU, and GPU -> GPU; each export of a moved sequence is the bytes
    // that came in.
    absl::StatusOr<SequenceId> g_from_cpu = gpu.ImportSequence(*from_cpu);
    absl::StatusOr<SequenceId> c_from_gpu = cpu.ImportSequence(*from_gpu);
    absl::StatusOr<SequenceId> g_from_gpu = gpu.ImportSequence(*from_gpu);
    ASSERT_TRUE(g_from_cpu.ok()) << g_from_cpu.status();
    ASSERT_TRUE(c_from_gpu.ok()) << c_from_gpu.status();
    ASSERT_TRUE(g_from_gpu.ok()) << g_from_gpu.status();
    EXPECT_EQ(gpu.PoolUsage().used_pages, used + 4) << "only the held pages are taken";
    absl::StatusOr<SequenceExport> again = gpu.ExportSequence(*g_from_cpu);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(again->pages == from_cpu->pages) << "CPU bytes changed on the way through the GPU";
    again = cpu.ExportSequence(*c_from_gpu);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(again->pages == from_gpu->pages) << "GPU bytes changed on the way through the CPU";

    // Each moved sequence against the one that stayed, with the same inputs, one call each.
    for (int step = 0; step < 11; ++step) {  // 45 -> 56 tokens: page 3 opens, page 1 evicted.
      SCOPED_TRACE(absl::StrCat("step ", step));
      const Tensor x = Hidden(1, dtype, rng);
      absl::StatusOr<Tensor> stayed_gpu = gpu.Decode({g}, x, {});
      absl::StatusOr<Tensor> stayed_cpu = cpu.Decode({c}, x, {});
      absl::StatusOr<Tensor> moved_gpu = gpu.Decode({*g_from_gpu}, x, {});
      absl::StatusOr<Tensor> cpu_to_gpu = gpu.Decode({*g_from_cpu}, x, {});
      absl::StatusOr<Tensor> gpu_to_cpu = cpu.Decode({*c_from_gpu}, x, {});
      for (const absl::StatusOr<Tensor>* out :
           {&stayed_gpu, &stayed_cpu, &moved_gpu, &cpu_to_gpu, &gpu_to_cpu}) {
        ASSERT_TRUE(out->ok()) << out->status();
      }
      ASSERT_TRUE(SameBits(*moved_gpu, *stayed_gpu)) << "GPU -> GPU decoded differently";
      EXPECT_LE(RelativeError(ToDoubles(*cpu_to_gpu), ToDoubles(*stayed_cpu)), CpuBound(dtype));
      EXPECT_LE(RelativeError(ToDoubles(*gpu_to_cpu), ToDoubles(*stayed_gpu)), CpuBound(dtype));
    }
    EXPECT_EQ(gpu.SequenceKvBytes(*g_from_cpu).value_or(-1), 2 * page_bytes);
    EXPECT_EQ(cpu.SequenceKvBytes(*c_from_gpu).value_or(-1), 2 * page_bytes);

    // An empty sequence moves too.
    absl::StatusOr<SequenceExport> empty = gpu.ExportSequence(gpu.CreateSequence());
    ASSERT_TRUE(empty.ok());
    EXPECT_TRUE(empty->pages.empty());
    absl::StatusOr<SequenceId> empty_moved = gpu.ImportSequence(*empty);
    ASSERT_TRUE(empty_moved.ok()) << empty_moved.status();
    EXPECT_EQ(gpu.SequenceLength(*empty_moved).value_or(-1), 0);

    for (SequenceId id : {g, *g_from_cpu, *g_from_gpu}) ASSERT_TRUE(gpu.ReleaseSequence(id).ok());
    EXPECT_EQ(gpu.PoolUsage().used_pages, 0);
    EXPECT_EQ(budget->used_bytes(), 0);
  }
}

// 8-bit pages hold what the CPU backend writes: both quantize with kernels/kv/kv_codes.h, so the
// exported bytes (codes and scales, 45 tokens: pages whose scales grew row by row) agree except
// where the two engines' fp32 K/V straddle a code's rounding edge (allowed: 1 byte in 1000). A
// CPU export decodes on the GPU as on the CPU (the GPU requantizing a page the CPU began), and a
// fork (its partial page copied with its scales) decodes bit for bit as its unforked twin.
TEST(CudaBackendContractTest, EightBitPagesHoldTheCpuBytes) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<AttentionBackend>> cpu_backend = CreateCpuBackend();
  ASSERT_TRUE(cpu_backend.ok());
  const LayerSpec spec = Spec(4, 2, 64, RopeLayout::kHalf);
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 41);
  ASSERT_TRUE(weights.ok());
  for (KvQuantization quantization : {KvQuantization::kFp8E4M3, KvQuantization::kInt8}) {
    const KvStorageFormat format = KvStorageFormat::Quantized(quantization);
    SCOPED_TRACE(KvStorageFormatName(format));
    absl::StatusOr<std::unique_ptr<AttentionLayer>> gpu_made =
        Gpu().backend->CreateLayer(spec, *weights, {format, 16, 64, nullptr});
    absl::StatusOr<std::unique_ptr<AttentionLayer>> cpu_made =
        (*cpu_backend)->CreateLayer(spec, *weights, {format, 16, 64, nullptr});
    ASSERT_TRUE(gpu_made.ok()) << gpu_made.status();
    ASSERT_TRUE(cpu_made.ok()) << cpu_made.status();
    AttentionLayer& gpu = **gpu_made;
    AttentionLayer& cpu = **cpu_made;
    std::mt19937_64 rng(23);
    const Tensor prompt = Hidden(45, DType::kF32, rng);
    const SequenceId g = gpu.CreateSequence(), c = cpu.CreateSequence(), twin = gpu.CreateSequence();
    for (const auto& [layer, id] :
         {std::pair{&gpu, g}, std::pair{&cpu, c}, std::pair{&gpu, twin}}) {
      ASSERT_TRUE(layer->Prefill({{id, 45}}, prompt, {}).ok());
    }
    absl::StatusOr<SequenceExport> from_gpu = gpu.ExportSequence(g);
    absl::StatusOr<SequenceExport> from_cpu = cpu.ExportSequence(c);
    ASSERT_TRUE(from_gpu.ok() && from_cpu.ok());
    ASSERT_EQ(from_gpu->pages.size(), from_cpu->pages.size());
    // The written bytes: each page's codes of its filled slots ([K|V][kv head][slot][dim]) and its
    // scales (the last page's unfilled slots hold whatever each pool had).
    const int64_t page_bytes = gpu.PoolUsage().page_bytes;
    const int page_size = 16, dim = spec.head_dim;
    int64_t compared = 0, differing = 0;
    for (int64_t page = 0; page * page_bytes < static_cast<int64_t>(from_gpu->pages.size());
         ++page) {
      const int filled = std::min<int>(page_size, 45 - static_cast<int>(page) * page_size);
      std::vector<int64_t> offsets;
      for (int row = 0; row < 2 * spec.num_kv_heads; ++row) {  // K heads, then V heads.
        for (int64_t b = 0; b < int64_t{filled} * dim; ++b) {
          offsets.push_back(int64_t{row} * page_size * dim + b);
        }
      }
      const int64_t scales = QuantizedPageScaleOffset(
          GqaPageElements(page_size, spec.num_kv_heads, spec.head_dim));
      for (int64_t b = scales; b < page_bytes; ++b) offsets.push_back(b);
      for (int64_t offset : offsets) {
        const size_t at = static_cast<size_t>(page * page_bytes + offset);
        ++compared;
        differing += from_gpu->pages[at] != from_cpu->pages[at] ? 1 : 0;
      }
    }
    std::printf("[8-bit] %s: %" PRId64 " of %" PRId64 " written page bytes differ from the CPU's\n",
                KvStorageFormatName(format).c_str(), differing, compared);
    EXPECT_LE(differing * 1000, compared);

    absl::StatusOr<SequenceId> g_from_cpu = gpu.ImportSequence(*from_cpu);
    ASSERT_TRUE(g_from_cpu.ok()) << g_from_cpu.status();
    absl::StatusOr<std::vector<SequenceId>> fork = gpu.ForkSequence(g, 1);
    ASSERT_TRUE(fork.ok()) << fork.status();
    for (int step = 0; step < 6; ++step) {  // 45 -> 51 tokens: rows join the imported page 2.
      SCOPED_TRACE(absl::StrCat("step ", step));
      const Tensor x = Hidden(1, DType::kF32, rng);
      absl::StatusOr<Tensor> stayed_cpu = cpu.Decode({c}, x, {});
      absl::StatusOr<Tensor> cpu_to_gpu = gpu.Decode({*g_from_cpu}, x, {});
      absl::StatusOr<Tensor> child = gpu.Decode({(*fork)[0]}, x, {});
      absl::StatusOr<Tensor> unforked = gpu.Decode({twin}, x, {});
      for (const absl::StatusOr<Tensor>* out : {&stayed_cpu, &cpu_to_gpu, &child, &unforked}) {
        ASSERT_TRUE(out->ok()) << out->status();
      }
      EXPECT_LE(RelativeError(ToDoubles(*cpu_to_gpu), ToDoubles(*stayed_cpu)), 1e-2);
      EXPECT_TRUE(SameBits(*child, *unforked)) << "a forked 8-bit page decoded differently";
    }
  }
}

// The layer's stage timer (attnserve_cuda_bench's breakdown) covers a call: every stage is
// measured, none is negative, and together they are no longer than the call itself.
TEST(CudaBackendContractTest, StageTimerCoversTheCall) {
  SKIP_WITHOUT_GPU();
  const LayerSpec spec = Spec(4, 2, 64, RopeLayout::kHalf);
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 4);
  ASSERT_TRUE(weights.ok());
  absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
      Gpu().backend->CreateLayer(spec, *weights, {DType::kBF16, 16, 64, nullptr});
  ASSERT_TRUE(layer.ok()) << layer.status();
  auto* cuda_layer = dynamic_cast<cuda::CudaGqaLayer*>(layer->get());
  ASSERT_NE(cuda_layer, nullptr);
  cuda_layer->EnableStageTiming(true);
  const SequenceId a = (*layer)->CreateSequence();
  std::mt19937_64 rng(9);
  const Tensor hidden = ToTensor(RandomHidden(40, 256, rng), {40, 256}, DType::kBF16);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<Tensor> out = (*layer)->Prefill({{a, 40}}, hidden, {});
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->dtype(), DType::kBF16);  // Converted on the device, downloaded as is.
  const cuda::LayerCallStages stages = cuda_layer->last_call_stages();
  for (int s = 0; s < static_cast<int>(cuda::LayerStage::kCount); ++s) {
    EXPECT_GE(stages.ms[s], 0.0) << cuda::LayerStageName(static_cast<cuda::LayerStage>(s));
  }
  EXPECT_GT(stages[cuda::LayerStage::kAttention], 0.0);
  EXPECT_GT(stages.Total(), 0.0);
  EXPECT_LE(stages.Total(), wall_ms * 1.01 + 0.05);
}

// A caller whose dtype is not the layer's activation dtype (an fp32 caller of bf16 pages, a bf16
// caller of f32 pages) has its input converted on the device, as the host's Tensor::CastTo would,
// and its output too: a twin sequence fed the host-converted input gives the same bits once both
// outputs are rounded to bf16. Prefill, then a decode step.
TEST(CudaBackendContractTest, CallerDtypeIsConvertedOnTheDevice) {
  SKIP_WITHOUT_GPU();
  const LayerSpec spec = Spec(4, 2, 64, RopeLayout::kHalf);
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 8);
  ASSERT_TRUE(weights.ok());
  for (const auto& [pages, caller] : {std::pair{DType::kBF16, DType::kF32},
                                      std::pair{DType::kF32, DType::kBF16}}) {
    SCOPED_TRACE(absl::StrCat(DTypeName(caller), " caller, ", DTypeName(pages), " pages"));
    absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
        Gpu().backend->CreateLayer(spec, *weights, {pages, 16, 64, nullptr});
    ASSERT_TRUE(layer.ok()) << layer.status();
    const SequenceId a = (*layer)->CreateSequence();
    const SequenceId b = (*layer)->CreateSequence();
    std::mt19937_64 rng(11);
    for (const int64_t rows : {int64_t{21}, int64_t{1}}) {  // A prefill, then a decode step.
      const Tensor x = ToTensor(RandomHidden(rows, 256, rng), {rows, 256}, caller);
      absl::StatusOr<Tensor> converted, twin;
      if (rows > 1) {
        converted = (*layer)->Prefill({{a, rows}}, x, {});
        twin = (*layer)->Prefill({{b, rows}}, x.CastTo(pages), {});
      } else {
        const SequenceId sa[] = {a}, sb[] = {b};
        converted = (*layer)->Decode(sa, x, {});
        twin = (*layer)->Decode(sb, x.CastTo(pages), {});
      }
      ASSERT_TRUE(converted.ok()) << converted.status();
      ASSERT_TRUE(twin.ok()) << twin.status();
      EXPECT_EQ(converted->dtype(), caller);
      EXPECT_EQ(twin->dtype(), pages);
      const Tensor c16 = converted->CastTo(DType::kBF16), t16 = twin->CastTo(DType::kBF16);
      ASSERT_EQ(c16.num_bytes(), t16.num_bytes());
      EXPECT_EQ(std::memcmp(c16.data(), t16.data(), c16.num_bytes()), 0) << "rows " << rows;
    }
  }
}

// An output that is not finite (here from an infinite input) is found on the device: the call
// fails with INVALID_ARGUMENT naming the element, and nothing is appended.
TEST(CudaBackendContractTest, NonFiniteOutputFailsTheCallAndAppendsNothing) {
  SKIP_WITHOUT_GPU();
  const LayerSpec spec = Spec(4, 2, 64, RopeLayout::kHalf);
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 6);
  ASSERT_TRUE(weights.ok());
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
        Gpu().backend->CreateLayer(spec, *weights, {dtype, 16, 64, nullptr});
    ASSERT_TRUE(layer.ok()) << layer.status();
    const SequenceId a = (*layer)->CreateSequence();
    std::mt19937_64 rng(5);
    std::vector<double> values = RandomHidden(20, 256, rng);
    ASSERT_TRUE((*layer)->Prefill({{a, 20}}, ToTensor(values, {20, 256}, dtype), {}).ok());
    values = RandomHidden(3, 256, rng);
    // Row 1's K and V become infinite; a kernel may multiply them by a zero weight for row 0 too
    // (0 x inf = NaN), so which row fails first is the kernel's business.
    values[256 + 7] = INFINITY;
    absl::StatusOr<Tensor> out = (*layer)->Prefill({{a, 3}}, ToTensor(values, {3, 256}, dtype), {});
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << DTypeName(dtype);
    EXPECT_NE(out.status().message().find("output is not finite (row "), absl::string_view::npos)
        << out.status();
    EXPECT_EQ(*(*layer)->SequenceLength(a), 20);
  }
}

TEST(CudaBackendContractTest, PoolExhaustionIsAllOrNothing) {
  SKIP_WITHOUT_GPU();
  const LayerSpec spec = Spec(4, 2, 64, RopeLayout::kHalf);
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 2);
  ASSERT_TRUE(weights.ok());
  absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
      Gpu().backend->CreateLayer(spec, *weights, {DType::kBF16, 16, 4, nullptr});
  ASSERT_TRUE(layer.ok()) << layer.status();
  const SequenceId a = (*layer)->CreateSequence(), b = (*layer)->CreateSequence();
  std::mt19937_64 rng(3);
  ASSERT_TRUE(
      (*layer)
          ->Prefill({{a, 40}}, ToTensor(RandomHidden(40, 256, rng), {40, 256}, DType::kBF16), {})
          .ok());
  // 3 pages held; b needs 2 more: refused, and nothing changes.
  absl::StatusOr<Tensor> out = (*layer)->Prefill(
      {{a, 1}, {b, 17}}, ToTensor(RandomHidden(18, 256, rng), {18, 256}, DType::kBF16), {});
  EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  EXPECT_EQ(*(*layer)->SequenceLength(a), 40);
  EXPECT_EQ(*(*layer)->SequenceLength(b), 0);
  EXPECT_EQ((*layer)->PoolUsage().used_pages, 3);
}

// The layer reports what it holds: 16-bit projection weights on the device for a bf16 layer
// (biases stay fp32), and each sequence's KV pages.
TEST(CudaBackendContractTest, LayerReportsTheBytesItHolds) {
  SKIP_WITHOUT_GPU();
  LayerSpec spec = Spec(4, 2, 64, RopeLayout::kHalf);
  spec.qkv_bias = true;
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 2);
  ASSERT_TRUE(weights.ok());
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
        Gpu().backend->CreateLayer(spec, *weights, {dtype, 16, 8, nullptr});
    ASSERT_TRUE(layer.ok()) << layer.status();
    const int64_t q = 4 * 64, kv = 2 * 64;
    const int64_t matrices = (q + 2 * kv) * 256 + 256 * q;
    EXPECT_EQ((*layer)->ParameterBytes(),
              matrices * static_cast<int64_t>(DTypeSize(dtype)) + (q + 2 * kv) * 4)
        << DTypeName(dtype);
    const SequenceId a = (*layer)->CreateSequence();
    std::mt19937_64 rng(3);
    const Tensor hidden = ToTensor(RandomHidden(40, 256, rng), {40, 256}, DType::kF32);
    ASSERT_TRUE((*layer)->Prefill({{a, 40}}, hidden, {}).ok());
    const int64_t page_bytes = (*layer)->PoolUsage().page_bytes;
    EXPECT_EQ(page_bytes, 16 * KvBytesPerToken(spec, dtype));
    EXPECT_EQ((*layer)->SequenceKvBytes(a).value_or(-1), 3 * page_bytes);
    EXPECT_EQ((*layer)->KvBytesAtLength(40), 3 * page_bytes);
  }
}

#if defined(ATTNSERVE_EMULATED_DEVICE)
}  // namespace
}  // namespace attnserve
extern "C" void AttnserveFakeCudaFailMemcpyAsync(int nth, cudaError_t error);
namespace attnserve {
namespace {

// A CUDA error after the pages were reserved (the upload, or the download after K/V were already
// appended) fails the call with the error and rolls the reservation back; the next call neither
// sees the old error (cudaGetLastError is per thread and sticky until read) nor the half-written
// tokens, and matches the CPU engine. Needs fault injection, so only on the emulated device.
TEST(CudaBackendContractTest, CudaErrorAfterReservationRollsBack) {
  SKIP_WITHOUT_GPU();
  const LayerSpec spec = Spec(4, 2, 64, RopeLayout::kHalf);
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 5);
  ASSERT_TRUE(weights.ok());
  absl::StatusOr<std::unique_ptr<AttentionBackend>> cpu_backend = CreateCpuBackend();
  ASSERT_TRUE(cpu_backend.ok());
  absl::StatusOr<std::unique_ptr<AttentionLayer>> gpu =
      Gpu().backend->CreateLayer(spec, *weights, {DType::kF32, 16, 64, nullptr});
  absl::StatusOr<std::unique_ptr<AttentionLayer>> cpu =
      (*cpu_backend)->CreateLayer(spec, *weights, {DType::kF32, 16, 64, nullptr});
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  const SequenceId g = (*gpu)->CreateSequence(), c = (*cpu)->CreateSequence();
  std::mt19937_64 rng(7);
  const Tensor first = ToTensor(RandomHidden(20, 256, rng), {20, 256}, DType::kF32);
  ASSERT_TRUE((*gpu)->Prefill({{g, 20}}, first, {}).ok());
  ASSERT_TRUE((*cpu)->Prefill({{c, 20}}, first, {}).ok());
  const int64_t pages = (*gpu)->PoolUsage().used_pages;
  for (int nth : {1, 2}) {  // 1: the batch upload; 2: the output download, after the append.
    SCOPED_TRACE(absl::StrCat("failing cudaMemcpyAsync #", nth));
    AttnserveFakeCudaFailMemcpyAsync(nth, cudaErrorLaunchFailure);
    absl::StatusOr<Tensor> failed = (*gpu)->Prefill(
        {{g, 13}}, ToTensor(RandomHidden(13, 256, rng), {13, 256}, DType::kF32), {});
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
    EXPECT_EQ(*(*gpu)->SequenceLength(g), 20);
    EXPECT_EQ((*gpu)->PoolUsage().used_pages, pages);
  }
  const Tensor next = ToTensor(RandomHidden(13, 256, rng), {13, 256}, DType::kF32);
  absl::StatusOr<Tensor> got = (*gpu)->Prefill({{g, 13}}, next, {});
  absl::StatusOr<Tensor> want = (*cpu)->Prefill({{c, 13}}, next, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok());
  EXPECT_LE(RelativeError(ToDoubles(*got), ToDoubles(*want)), 1e-4);
  EXPECT_EQ(*(*gpu)->SequenceLength(g), 33);
}

// A CUDA error in a fork's page copy, an export's download or an import's upload fails the call
// with it and changes nothing: no new sequence, no page or budget byte kept, the source as it was.
TEST(CudaBackendContractTest, CudaErrorInForkExportOrImportChangesNothing) {
  SKIP_WITHOUT_GPU();
  const LayerSpec spec = Spec(4, 2, 64, RopeLayout::kHalf);
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 8);
  ASSERT_TRUE(weights.ok());
  auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  absl::StatusOr<std::unique_ptr<AttentionLayer>> made =
      Gpu().backend->CreateLayer(spec, *weights, {DType::kBF16, 16, 64, budget});
  ASSERT_TRUE(made.ok()) << made.status();
  AttentionLayer& layer = **made;
  std::mt19937_64 rng(23);
  const SequenceId a = layer.CreateSequence();
  ASSERT_TRUE(layer
                  .Prefill({{a, 37}},
                           ToTensor(RandomHidden(37, 256, rng), {37, 256}, DType::kBF16), {})
                  .ok());
  absl::StatusOr<SequenceExport> exported = layer.ExportSequence(a);
  ASSERT_TRUE(exported.ok());
  const int64_t used = layer.PoolUsage().used_pages, charged = budget->used_bytes();
  auto unchanged = [&] {
    EXPECT_EQ(layer.PoolUsage().used_pages, used);
    EXPECT_EQ(budget->used_bytes(), charged);
    EXPECT_EQ(layer.SequenceLength(a).value_or(-1), 37);
  };
  AttnserveFakeCudaFailMemcpyAsync(1, cudaErrorLaunchFailure);
  EXPECT_EQ(layer.ForkSequence(a, 2).status().code(), absl::StatusCode::kInternal);
  unchanged();
  AttnserveFakeCudaFailMemcpyAsync(2, cudaErrorLaunchFailure);  // The second of three pages.
  EXPECT_EQ(layer.ExportSequence(a).status().code(), absl::StatusCode::kInternal);
  unchanged();
  AttnserveFakeCudaFailMemcpyAsync(3, cudaErrorLaunchFailure);  // The last of three pages.
  EXPECT_EQ(layer.ImportSequence(*exported).status().code(), absl::StatusCode::kInternal);
  unchanged();
  // Nothing was left behind: the same calls now succeed, the import with the bytes exported.
  absl::StatusOr<SequenceId> moved = layer.ImportSequence(*exported);
  ASSERT_TRUE(moved.ok()) << moved.status();
  absl::StatusOr<SequenceExport> again = layer.ExportSequence(*moved);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->pages == exported->pages);
  EXPECT_TRUE(layer.ForkSequence(a, 2).ok());
}
#endif

// Printed at the very end of the program (after gtest's own summary), so it is the last output.
class SummaryPrinter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestProgramEnd(const ::testing::UnitTest&) override {
    if (Gpu().backend == nullptr) {
      std::printf("\nCUDA vs CPU summary: SKIPPED (%s)\n", Gpu().why_not.c_str());
      return;
    }
    // Each implementation's own description (device, attention kernels), over the rows it ran.
    std::printf("\nCUDA vs CPU summary\n");
    for (CudaAttentionImpl impl : Implementations()) {
      const std::string name = CudaAttentionImplName(impl);
      const bool ran = std::any_of(Summary().begin(), Summary().end(),
                                   [&](const SummaryRow& r) { return r.impl == name; });
      if (ran && Gpu(impl).backend != nullptr) {
        std::printf("  %s: %s\n", name.c_str(), Gpu(impl).backend->device_description().c_str());
      }
    }
    std::printf("%-30s %-5s %-10s %-8s %5s %12s %10s %s\n", "case", "kv", "impl", "phase",
                "calls", "worst_rel", "bound", "result");
    int flashinfer_rows = 0, flashinfer_failed = 0;
    for (const SummaryRow& r : Summary()) {
      const bool pass = r.worst <= r.bound;  // NaN fails.
      std::printf("%-30s %-5s %-10s %-8s %5d %12.3e %10.1e %s\n", r.name.c_str(), r.kv.c_str(),
                  r.impl.c_str(), r.phase.c_str(), r.calls, r.worst, r.bound,
                  pass ? "PASS" : "FAIL");
      if (r.impl == "flashinfer") {
        ++flashinfer_rows;
        if (!pass) ++flashinfer_failed;
      }
    }
    // A case that stopped before its summary rows (an ASSERT) is a failed test: count those too.
    const int failed_tests = ::testing::UnitTest::GetInstance()->failed_test_count();
#if defined(ATTNSERVE_EMULATED_DEVICE)
    if (true) {
      std::printf("flashinfer correct: not run (FlashInfer's kernels need a GPU)\n");
    } else
#endif
    if (flashinfer_rows == 0) {
      std::printf("flashinfer correct: no (no FlashInfer case ran)\n");
    } else if (flashinfer_failed > 0 || failed_tests > 0) {
      std::printf("flashinfer correct: no (%d of %d FlashInfer rows failed, %d tests failed)\n",
                  flashinfer_failed, flashinfer_rows, failed_tests);
    } else {
      std::printf("flashinfer correct: yes (%d FlashInfer rows passed, no test failed)\n",
                  flashinfer_rows);
    }
    std::fflush(stdout);
  }
};

const bool kSummaryRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SummaryPrinter);
  return true;
}();

}  // namespace
}  // namespace attnserve

// The CUDA backend's MLA layer (kernels/cuda/layer/cuda_mla_layer.h, absorbed form) against the
// CPU engine's (kernels/cpu/mla_layer.h: expanded prefill, absorbed decode): prefill of a ragged
// batch, a second prefill chunk over the cached prefix (explicit positions), decode steps across
// page boundaries and split-KV, Fork, and Export/Import between the two backends.
//
// Tolerances (relative 2-norm per call, ||gpu - cpu|| / ||cpu||). With f32 pages the MLA layer
// computes in fp32, as the CPU engine does, so the two differ only by summation order (cuBLAS vs
// OpenBLAS, the GPU's absorbed prefill vs the CPU's expanded one). With bf16 pages its projections
// run as CudaGqaLayer's, on bf16 resident weights with bf16 inputs (x, the normalised q_a, the W_UV
// output) and fp32 accumulation, while the CPU engine keeps fp32 weights: about as many
// independent roundings of u/sqrt(3) (u = 2^-8) meet in the output as in the GQA layer, so the
// bound is the GQA layer's bf16 bound (cuda_backend_test.cc). Worst call seen on the emulated
// device: f32 4.96e-7, bf16 6.5e-3 (6.1e-5 while the projections ran in fp32).
//   f32 pages, f32 I/O:   1e-4
//   bf16 pages, bf16 I/O: 1.6e-2  4u
//   fp8 / int8 pages, f32 I/O: 1e-2  the GQA layer's 8-bit bound (cuda_backend_test.cc): both
//                       engines compute in fp32 and quantize the same latent with
//                       kernels/kv/kv_codes.h, so the pages agree byte for byte unless the two
//                       fp32 latents straddle a code's rounding edge. Worst call seen on the
//                       emulated device: fp8 4.3e-7, int8 5.5e-4 (one code edge; else 4.1e-7).
// The GPU runs with poison_for_testing (NaN pool, pages and workspace), so a slot read before it
// is written fails (NaN never passes a bound).
//
// Built twice, as cuda_backend_test.cc: cuda_mla_test for a device (skips without one; run by
// tests/gpu/run.sh) and cuda_mla_emulated_test on the emulated device (tests/gpu/emulated), in CI:
// the AllVariants/ cases are the sweep (tier 2), the rest tier 1.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/layer/cuda_mla_layer.h"
#include "kernels/cuda/runtime/cuda_backend.h"
#include "kernels/kv/page_layout.h"
#include "kernels/kv/quantization.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/model/layer_weights.h"
#include "kernels/spec/layer_spec.h"
#include "tests/reference/attention_reference.h"

namespace attnserve {
namespace {

using reference::RandomHidden;
using reference::RelativeError;
using reference::ToDoubles;
using reference::ToTensor;

struct GpuBackend {
  std::unique_ptr<AttentionBackend> backend;
  std::string why_not;
};

GpuBackend& Gpu() {
  static GpuBackend* gpu = [] {
    auto* g = new GpuBackend;
    CudaBackendOptions options;
    options.kv_pool_bytes = int64_t{1} << 28;
    options.poison_for_testing = true;
    options.attention = CudaAttentionImpl::kNative;
    absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCudaBackend(options);
    if (backend.ok()) {
      g->backend = std::move(*backend);
    } else {
      g->why_not = backend.status().ToString();
    }
    return g;
  }();
  return *gpu;
}

#if defined(ATTNSERVE_EMULATED_DEVICE)
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

constexpr int kDModel = 128;

// Small DeepSeek-shaped layers (the emulator runs every block on the CPU).
LayerSpec MlaSpec(int heads, int q_lora, int kv_lora, int rope, int nope, int v,
                  RopeLayout layout) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMLA;
  spec.d_model = kDModel;
  spec.num_heads = heads;
  spec.num_kv_heads = heads;
  spec.rope = layout;
  spec.mla = {.q_lora_rank = q_lora,
              .kv_lora_rank = kv_lora,
              .qk_nope_head_dim = nope,
              .qk_rope_head_dim = rope,
              .v_head_dim = v};
  return spec;
}

struct MlaCase {
  std::string name;
  LayerSpec spec;
  int page_size = 64;
  int long_prompt = 520;  // The long sequence: 520 keys give decode two splits (>= 256 each).
};

std::vector<MlaCase> Cases() {
  std::vector<MlaCase> cases;
  {
    // q LoRA, DeepSeek-V3's YaRN (mscale == mscale_all_dim: the softmax scale gains mscale^2,
    // the cos/sin factor stays 1), interleaved RoPE, pages of 16.
    LayerSpec s = MlaSpec(4, 48, 64, 16, 32, 32, RopeLayout::kInterleaved);
    s.rope_scaling = {.type = RopeScalingType::kYarn,
                      .factor = 40.0,
                      .original_max_position_embeddings = 64,
                      .mscale = 1.0,
                      .mscale_all_dim = 1.0};
    cases.push_back({"mla_qlora_yarn_page16", s, 16});
  }
  // No q LoRA, 20 heads (two blocks of 16 rows per split), half-layout RoPE, MLA's pages of 64.
  // Its long prompt is shorter: 20 heads make 20 query rows per token on the emulator.
  cases.push_back(
      {"mla_h20_half_page64", MlaSpec(20, 0, 32, 16, 16, 24, RopeLayout::kHalf), 64, 200});
  return cases;
}

struct DtypeCase {
  KvStorageFormat kv;  // GPU and CPU pages.
  DType io;            // The hidden/output dtype.
  double bound;
};
const DtypeCase kDtypes[] = {
    {DType::kF32, DType::kF32, 1e-4},
    {DType::kBF16, DType::kBF16, 1.6e-2},
    {KvStorageFormat::Quantized(KvQuantization::kFp8E4M3), DType::kF32, 1e-2},
    {KvStorageFormat::Quantized(KvQuantization::kInt8), DType::kF32, 1e-2},
};

void PrintTo(const MlaCase& c, std::ostream* os) { *os << c.name; }
void PrintTo(const DtypeCase& d, std::ostream* os) { *os << KvStorageFormatName(d.kv); }

class CudaMlaVsCpuTest : public ::testing::TestWithParam<std::tuple<MlaCase, DtypeCase>> {};

TEST_P(CudaMlaVsCpuTest, PrefillChunkedPrefillAndDecodeMatchCpu) {
  SKIP_WITHOUT_GPU();
  const MlaCase& c = std::get<0>(GetParam());
  const DtypeCase& dt = std::get<1>(GetParam());
  const uint64_t seed =
      std::random_device{}() * uint64_t{0x9E3779B97F4A7C15} ^ std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(c.spec, seed);
  ASSERT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<std::unique_ptr<AttentionBackend>> cpu_backend = CreateCpuBackend();
  ASSERT_TRUE(cpu_backend.ok());
  const KvCacheConfig config{dt.kv, c.page_size, 1024, nullptr};
  absl::StatusOr<std::unique_ptr<AttentionLayer>> gpu =
      Gpu().backend->CreateLayer(c.spec, *weights, config);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<AttentionLayer>> cpu =
      (*cpu_backend)->CreateLayer(c.spec, *weights, config);
  ASSERT_TRUE(cpu.ok()) << cpu.status();

  // Ragged lengths across pages (16/64), key tiles (16), row blocks (16 rows), and one long
  // sequence (two decode splits at 520 keys).
  const std::vector<int64_t> first = {1, 37, 70, c.long_prompt};
  const std::vector<int64_t> second = {17, 1, 33, 2};
  std::vector<SequenceId> gpu_ids, cpu_ids;
  for (size_t i = 0; i < first.size(); ++i) {
    gpu_ids.push_back((*gpu)->CreateSequence());
    cpu_ids.push_back((*cpu)->CreateSequence());
  }
  double worst_prefill = 0.0, worst_decode = 0.0;
  auto compare = [&](const Tensor& g, const Tensor& r, double& worst, const std::string& what) {
    const double err = RelativeError(ToDoubles(g), ToDoubles(r));
    worst = std::isnan(err) || std::isnan(worst) ? NAN : std::max(worst, err);
    EXPECT_LE(err, dt.bound) << what;  // NaN fails.
  };
  // Two prefill calls per sequence: the second a chunk over the cached prefix, with explicit
  // positions offset by 1000 for sequence 0.
  for (int call = 0; call < 2; ++call) {
    const std::vector<int64_t>& counts = call == 0 ? first : second;
    std::vector<PrefillChunk> gpu_chunks, cpu_chunks;
    int64_t rows = 0;
    std::vector<int64_t> positions;
    for (size_t i = 0; i < counts.size(); ++i) {
      gpu_chunks.push_back({gpu_ids[i], counts[i]});
      cpu_chunks.push_back({cpu_ids[i], counts[i]});
      rows += counts[i];
      if (call == 1) {
        const int64_t start = first[i] + (i == 0 ? 1000 : 0);
        for (int64_t t = 0; t < counts[i]; ++t) positions.push_back(start + t);
      }
    }
    const Tensor hidden = ToTensor(RandomHidden(rows, kDModel, rng), {rows, kDModel}, dt.io);
    absl::StatusOr<Tensor> g = (*gpu)->Prefill(gpu_chunks, hidden, positions);
    absl::StatusOr<Tensor> r = (*cpu)->Prefill(cpu_chunks, hidden, positions);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(g->dtype(), dt.io);
    compare(*g, *r, worst_prefill, absl::StrCat("prefill call ", call));
  }
  // Decode: 12 steps of the whole batch (crosses a page of 16), then 3 of a sub-batch reordered.
  for (int step = 0; step < 15; ++step) {
    std::vector<size_t> which = {0, 1, 2, 3};
    if (step >= 12) which = {3, 0};
    std::vector<SequenceId> g_ids, c_ids;
    for (size_t i : which) {
      g_ids.push_back(gpu_ids[i]);
      c_ids.push_back(cpu_ids[i]);
    }
    const int64_t rows = static_cast<int64_t>(which.size());
    const Tensor hidden = ToTensor(RandomHidden(rows, kDModel, rng), {rows, kDModel}, dt.io);
    absl::StatusOr<Tensor> g = (*gpu)->Decode(g_ids, hidden, {});
    absl::StatusOr<Tensor> r = (*cpu)->Decode(c_ids, hidden, {});
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(r.ok()) << r.status();
    compare(*g, *r, worst_decode, absl::StrCat("decode step ", step));
  }
  EXPECT_EQ((*gpu)->PoolUsage().used_pages, (*cpu)->PoolUsage().used_pages);
  for (size_t i = 0; i < gpu_ids.size(); ++i) {
    EXPECT_EQ(*(*gpu)->SequenceLength(gpu_ids[i]), *(*cpu)->SequenceLength(cpu_ids[i]));
    ASSERT_TRUE((*gpu)->ReleaseSequence(gpu_ids[i]).ok());
  }
  EXPECT_EQ((*gpu)->PoolUsage().used_pages, 0);
  std::printf("[mla] %s kv=%s worst prefill %.3g decode %.3g (bound %.3g) seed=%" PRIu64 "\n",
              c.name.c_str(), KvStorageFormatName(dt.kv).c_str(), worst_prefill, worst_decode,
              dt.bound, seed);
}

std::string CaseName(const ::testing::TestParamInfo<std::tuple<MlaCase, DtypeCase>>& info) {
  return absl::StrCat(std::get<0>(info.param).name, "_",
                      KvStorageFormatName(std::get<1>(info.param).kv));
}

INSTANTIATE_TEST_SUITE_P(AllVariants, CudaMlaVsCpuTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()),
                                            ::testing::ValuesIn(kDtypes)),
                         CaseName);

// ---- Fork, Export, Import (tier 1: small) --------------------------------------------------------

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.num_bytes()) == 0;
}

Tensor Hidden(int64_t rows, DType dtype, std::mt19937_64& rng) {
  return ToTensor(RandomHidden(rows, kDModel, rng), {rows, kDModel}, dtype);
}

// A fork shares the source's full pages and copies its partial last page; the child then decodes
// bit for bit as a twin prefilled by the same call, and the source's pages stay as they were.
TEST(CudaMlaContractTest, ForkedChildDecodesAsTwin) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const LayerSpec spec = MlaSpec(4, 0, 32, 16, 16, 16, RopeLayout::kHalf);
    absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 41);
    ASSERT_TRUE(weights.ok());
    auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
    absl::StatusOr<std::unique_ptr<AttentionLayer>> made =
        Gpu().backend->CreateLayer(spec, *weights, {dtype, 16, 64, budget});
    ASSERT_TRUE(made.ok()) << made.status();
    AttentionLayer& layer = **made;
    std::mt19937_64 rng(19);
    const Tensor prompt = Hidden(21, dtype, rng);  // One full page and 5 tokens.
    const SequenceId source = layer.CreateSequence(), twin = layer.CreateSequence();
    for (SequenceId id : {source, twin}) ASSERT_TRUE(layer.Prefill({{id, 21}}, prompt, {}).ok());
    absl::StatusOr<SequenceExport> before = layer.ExportSequence(source);
    ASSERT_TRUE(before.ok()) << before.status();
    EXPECT_EQ(layer.ForkSequence(12345, 1).status().code(), absl::StatusCode::kNotFound);
    absl::StatusOr<std::vector<SequenceId>> forks = layer.ForkSequence(source, 1);
    ASSERT_TRUE(forks.ok()) << forks.status();
    EXPECT_EQ(layer.PoolUsage().used_pages, 5) << "source 2, twin 2, the child's copied page 1";
    absl::StatusOr<SequenceExport> child_pages = layer.ExportSequence((*forks)[0]);
    ASSERT_TRUE(child_pages.ok());
    EXPECT_EQ(child_pages->pages, before->pages) << "the child starts from the source's bytes";
    for (int step = 0; step < 14; ++step) {  // Past the page boundary at 32.
      const Tensor x = Hidden(1, dtype, rng);
      absl::StatusOr<Tensor> got = layer.Decode({(*forks)[0]}, x, {});
      absl::StatusOr<Tensor> want = layer.Decode({twin}, x, {});
      ASSERT_TRUE(got.ok() && want.ok());
      ASSERT_TRUE(SameBits(*got, *want)) << "a forked child decoded differently, step " << step;
    }
    absl::StatusOr<SequenceExport> after = layer.ExportSequence(source);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(after->pages, before->pages) << "the child's decode wrote into the source's pages";
    for (SequenceId id : {source, twin, (*forks)[0]}) ASSERT_TRUE(layer.ReleaseSequence(id).ok());
    EXPECT_EQ(layer.PoolUsage().used_pages, 0);
    EXPECT_EQ(budget->used_bytes(), 0);
  }
}

// The latent pages move between the CPU and the GPU in one byte format: a GPU export imports on
// the CPU (and back) and decodes on within the sweep's bounds; a GPU -> GPU move decodes bit for
// bit as the original. Without RoPE (the sweep has both layouts): q_pe still meets k_pe.
TEST(CudaMlaContractTest, ExportImportMovesLatentPagesBetweenCpuAndGpu) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const double bound = dtype == DType::kF32 ? 1e-4 : 1.6e-2;  // As the sweep's.
    const LayerSpec spec = MlaSpec(4, 24, 32, 16, 16, 16, RopeLayout::kNone);
    absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 43);
    ASSERT_TRUE(weights.ok());
    absl::StatusOr<std::unique_ptr<AttentionBackend>> cpu_backend = CreateCpuBackend();
    ASSERT_TRUE(cpu_backend.ok());
    const KvCacheConfig config{dtype, 16, 64, nullptr};
    absl::StatusOr<std::unique_ptr<AttentionLayer>> g = Gpu().backend->CreateLayer(spec, *weights, config);
    absl::StatusOr<std::unique_ptr<AttentionLayer>> c = (*cpu_backend)->CreateLayer(spec, *weights, config);
    ASSERT_TRUE(g.ok() && c.ok());
    AttentionLayer& gpu = **g;
    AttentionLayer& cpu = **c;
    std::mt19937_64 rng(23);
    const Tensor prompt = Hidden(37, dtype, rng);
    const SequenceId gs = gpu.CreateSequence(), cs = cpu.CreateSequence();
    ASSERT_TRUE(gpu.Prefill({{gs, 37}}, prompt, {}).ok());
    ASSERT_TRUE(cpu.Prefill({{cs, 37}}, prompt, {}).ok());
    absl::StatusOr<SequenceExport> from_gpu = gpu.ExportSequence(gs);
    absl::StatusOr<SequenceExport> from_cpu = cpu.ExportSequence(cs);
    ASSERT_TRUE(from_gpu.ok() && from_cpu.ok());
    EXPECT_EQ(from_gpu->page_bytes, from_cpu->page_bytes);
    EXPECT_EQ(from_gpu->pages.size(), from_cpu->pages.size());
    EXPECT_EQ(from_gpu->num_tokens, 37);
    absl::StatusOr<SequenceId> c_from_gpu = cpu.ImportSequence(*from_gpu);
    absl::StatusOr<SequenceId> g_from_cpu = gpu.ImportSequence(*from_cpu);
    absl::StatusOr<SequenceId> g_from_gpu = gpu.ImportSequence(*from_gpu);
    ASSERT_TRUE(c_from_gpu.ok()) << c_from_gpu.status();
    ASSERT_TRUE(g_from_cpu.ok()) << g_from_cpu.status();
    ASSERT_TRUE(g_from_gpu.ok()) << g_from_gpu.status();
    absl::StatusOr<SequenceExport> again = gpu.ExportSequence(*g_from_cpu);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->pages, from_cpu->pages) << "an import stores the bytes verbatim";
    for (int step = 0; step < 12; ++step) {  // Past the page boundary at 48.
      const Tensor x = Hidden(1, dtype, rng);
      absl::StatusOr<Tensor> original = gpu.Decode({gs}, x, {});
      absl::StatusOr<Tensor> moved = gpu.Decode({*g_from_gpu}, x, {});
      absl::StatusOr<Tensor> on_cpu = cpu.Decode({*c_from_gpu}, x, {});
      absl::StatusOr<Tensor> cpu_original = cpu.Decode({cs}, x, {});
      absl::StatusOr<Tensor> gpu_from_cpu = gpu.Decode({*g_from_cpu}, x, {});
      ASSERT_TRUE(original.ok() && moved.ok() && on_cpu.ok() && cpu_original.ok() &&
                  gpu_from_cpu.ok());
      EXPECT_TRUE(SameBits(*moved, *original)) << "GPU -> GPU, step " << step;
      EXPECT_LE(RelativeError(ToDoubles(*on_cpu), ToDoubles(*original)), bound)
          << "GPU -> CPU, step " << step;
      EXPECT_LE(RelativeError(ToDoubles(*gpu_from_cpu), ToDoubles(*cpu_original)), bound)
          << "CPU -> GPU, step " << step;
    }
  }
}

// 8-bit latent pages hold what the CPU backend writes, as EightBitPagesHoldTheCpuBytes checks for
// GQA (cuda_backend_test.cc): both quantize with kernels/kv/kv_codes.h and the page's two scales
// (latent, RoPE key), so the exported bytes (codes and scales, 45 tokens: pages whose scales grew
// row by row) agree except where the two engines' fp32 latents straddle a code's rounding edge
// (allowed: 1 byte in 1000). A CPU export decodes on the GPU as on the CPU (the GPU requantizing a
// page the CPU began), and a fork (its partial page copied with its scales) decodes bit for bit
// as its unforked twin.
TEST(CudaMlaContractTest, EightBitLatentPagesHoldTheCpuBytes) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<AttentionBackend>> cpu_backend = CreateCpuBackend();
  ASSERT_TRUE(cpu_backend.ok());
  const LayerSpec spec = MlaSpec(4, 48, 64, 16, 32, 32, RopeLayout::kInterleaved);
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
    const SequenceId g = gpu.CreateSequence(), c = cpu.CreateSequence();
    const SequenceId twin = gpu.CreateSequence();
    for (const auto& [layer, id] :
         {std::pair{&gpu, g}, std::pair{&cpu, c}, std::pair{&gpu, twin}}) {
      ASSERT_TRUE(layer->Prefill({{id, 45}}, prompt, {}).ok());
    }
    absl::StatusOr<SequenceExport> from_gpu = gpu.ExportSequence(g);
    absl::StatusOr<SequenceExport> from_cpu = cpu.ExportSequence(c);
    ASSERT_TRUE(from_gpu.ok() && from_cpu.ok());
    ASSERT_EQ(from_gpu->pages.size(), from_cpu->pages.size());
    // The written bytes: each page's codes of its filled slots ([slot][latent | rope]) and its two
    // scales (the last page's unfilled slots hold whatever each pool had).
    const int64_t page_bytes = gpu.PoolUsage().page_bytes;
    const int page_size = 16, width = spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim;
    const int64_t scales = QuantizedPageScaleOffset(int64_t{page_size} * width);
    ASSERT_EQ(page_bytes, QuantizedPageBytes(int64_t{page_size} * width, MlaPageScaleCount()));
    int64_t compared = 0, differing = 0;
    for (int64_t page = 0; page * page_bytes < static_cast<int64_t>(from_gpu->pages.size());
         ++page) {
      const int filled = std::min<int>(page_size, 45 - static_cast<int>(page) * page_size);
      std::vector<int64_t> offsets;
      for (int64_t b = 0; b < int64_t{filled} * width; ++b) offsets.push_back(b);
      for (int64_t b = scales; b < page_bytes; ++b) offsets.push_back(b);
      for (int64_t offset : offsets) {
        const size_t at = static_cast<size_t>(page * page_bytes + offset);
        ++compared;
        differing += from_gpu->pages[at] != from_cpu->pages[at] ? 1 : 0;
      }
    }
    std::printf("[mla 8-bit] %s: %" PRId64 " of %" PRId64
                " written page bytes differ from the CPU's\n",
                KvStorageFormatName(format).c_str(), differing, compared);
    EXPECT_LE(differing * 1000, compared);

    absl::StatusOr<SequenceId> g_from_cpu = gpu.ImportSequence(*from_cpu);
    ASSERT_TRUE(g_from_cpu.ok()) << g_from_cpu.status();
    absl::StatusOr<std::vector<SequenceId>> fork = gpu.ForkSequence(g, 1);
    ASSERT_TRUE(fork.ok()) << fork.status();
    double worst = 0.0;
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
      const double err = RelativeError(ToDoubles(*cpu_to_gpu), ToDoubles(*stayed_cpu));
      worst = std::isnan(err) ? NAN : std::max(worst, err);
      EXPECT_LE(err, 1e-2);  // The sweep's 8-bit bound; NaN fails.
      EXPECT_TRUE(SameBits(*child, *unforked)) << "a forked 8-bit page decoded differently";
    }
    std::printf("[mla 8-bit] %s: CPU export decoded on the GPU, worst %.3g (bound 1e-2)\n",
                KvStorageFormatName(format).c_str(), worst);
  }
}

// FlashInfer's MLA kernel (--cuda_attention=flashinfer; bf16 pages at DeepSeek's 512 + 64) inside
// the layer against the CPU engine: prefill, a chunk over the cached prefix, decode with a long
// sequence. Needs a device and a build with FlashInfer: it SKIPS on the emulated device (which
// cannot run FlashInfer's kernels) and has NOT RUN on a device yet. Bound: the sweep's bf16 (the
// bf16 projections' roundings dominate; FlashInfer's bf16 queries and output add two more).
TEST(CudaMlaContractTest, FlashInferMlaMatchesCpu) {
#if defined(ATTNSERVE_EMULATED_DEVICE)
  GTEST_SKIP() << "FlashInfer's kernels do not run on the emulated device";
#else
  SKIP_WITHOUT_GPU();
  if (!FlashInferBuilt()) GTEST_SKIP() << "this build has no FlashInfer";
  CudaBackendOptions options;
  options.kv_pool_bytes = int64_t{1} << 30;
  options.poison_for_testing = true;
  options.attention = CudaAttentionImpl::kFlashInfer;
  absl::StatusOr<std::unique_ptr<AttentionBackend>> fi_backend = CreateCudaBackend(options);
  ASSERT_TRUE(fi_backend.ok()) << fi_backend.status();
  LayerSpec spec = MlaSpec(16, 96, 512, 64, 64, 64, RopeLayout::kInterleaved);
  spec.d_model = kDModel;
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 47);
  ASSERT_TRUE(weights.ok());
  const KvCacheConfig config{DType::kBF16, 64, 1024, nullptr};
  absl::StatusOr<std::unique_ptr<AttentionLayer>> g = (*fi_backend)->CreateLayer(spec, *weights, config);
  ASSERT_TRUE(g.ok()) << g.status();
  auto* mla = dynamic_cast<cuda::CudaMlaLayer*>(g->get());
  ASSERT_NE(mla, nullptr);
  ASSERT_TRUE(mla->uses_flashinfer()) << "512 + 64 bf16 causal should run on FlashInfer";
  absl::StatusOr<std::unique_ptr<AttentionBackend>> cpu_backend = CreateCpuBackend();
  ASSERT_TRUE(cpu_backend.ok());
  absl::StatusOr<std::unique_ptr<AttentionLayer>> c = (*cpu_backend)->CreateLayer(spec, *weights, config);
  ASSERT_TRUE(c.ok());
  std::mt19937_64 rng(29);
  const std::vector<int64_t> lengths = {1, 70, 3000};
  std::vector<SequenceId> gs, cs;
  std::vector<PrefillChunk> gchunks, cchunks;
  int64_t rows = 0;
  for (int64_t n : lengths) {
    gs.push_back((*g)->CreateSequence());
    cs.push_back((*c)->CreateSequence());
    gchunks.push_back({gs.back(), n});
    cchunks.push_back({cs.back(), n});
    rows += n;
  }
  const double bound = 1.6e-2;
  auto check = [&](absl::StatusOr<Tensor> got, absl::StatusOr<Tensor> want, const char* what) {
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(want.ok()) << want.status();
    const double err = RelativeError(ToDoubles(*got), ToDoubles(*want));
    std::printf("[mla] flashinfer %s: %.3g (bound %.3g)\n", what, err, bound);
    EXPECT_LE(err, bound) << what;
  };
  Tensor x = Hidden(rows, DType::kBF16, rng);
  check((*g)->Prefill(gchunks, x, {}), (*c)->Prefill(cchunks, x, {}), "prefill");
  x = Hidden(3 * 5, DType::kBF16, rng);
  for (size_t i = 0; i < gchunks.size(); ++i) gchunks[i].num_tokens = cchunks[i].num_tokens = 5;
  check((*g)->Prefill(gchunks, x, {}), (*c)->Prefill(cchunks, x, {}), "chunk over a prefix");
  for (int step = 0; step < 4; ++step) {
    x = Hidden(3, DType::kBF16, rng);
    check((*g)->Decode(gs, x, {}), (*c)->Decode(cs, x, {}), "decode");
  }
#endif
}

// Widths the native kernels are not built for are refused by name when the layer is created.
TEST(CudaMlaContractTest, UnservedLatentWidthIsInvalidArgument) {
  SKIP_WITHOUT_GPU();
  const LayerSpec spec = MlaSpec(4, 0, 48, 16, 16, 16, RopeLayout::kHalf);  // 48: not 32k.
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 1);
  ASSERT_TRUE(weights.ok());
  absl::StatusOr<std::unique_ptr<AttentionLayer>> made =
      Gpu().backend->CreateLayer(spec, *weights, {DType::kF32, 16, 16, nullptr});
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(made.status().message().find("mla.kv_lora_rank"), std::string::npos)
      << made.status();
}

}  // namespace
}  // namespace attnserve

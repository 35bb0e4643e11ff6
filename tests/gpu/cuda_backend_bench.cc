// attnserve_cuda_bench: whole CUDA layer calls (each synchronous: host plan, upload, kernels,
// download), under each attention implementation (native, and flashinfer where built), with the
// per-stage breakdown of the layer's StageTimer (kernels/cuda/layer/stage_timer.h): where a call's
// time goes, and the call against its kernels alone (qkv GEMM + RoPE/append + attention + o GEMM).
// Median of repeated calls after a warm-up. Exits 0 with a note when there is no usable device.
//
//   attnserve_cuda_bench [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/layer/cuda_layer_base.h"
#include "kernels/cuda/layer/stage_timer.h"
#include "kernels/cuda/runtime/cuda_backend.h"
#include "kernels/model/layer_weights.h"
#include "tests/reference/attention_reference.h"

namespace attnserve {
namespace {

using cuda::LayerCallStages;
using cuda::LayerStage;

struct BenchCase {
  const char* name;
  int heads, kv_heads, head_dim, d_model;
  DType kv;
  int batch;
  int context;  // Tokens cached per sequence before decode.
};

// Per stage, the median over calls (each stage's own median).
LayerCallStages MedianStages(const std::vector<LayerCallStages>& calls) {
  LayerCallStages median;
  for (size_t s = 0; s < median.ms.size(); ++s) {
    std::vector<double> v;
    for (const LayerCallStages& c : calls) v.push_back(c.ms[s]);
    std::sort(v.begin(), v.end());
    median.ms[s] = v.empty() ? 0.0 : v[v.size() / 2];
  }
  return median;
}

double Kernels(const LayerCallStages& s) {
  return s[LayerStage::kQkvGemm] + s[LayerStage::kRopeAppend] + s[LayerStage::kAttention] +
         s[LayerStage::kOutGemm];
}

void PrintRow(const char* name, const char* impl, const char* phase, int batch, int tokens,
              const LayerCallStages& s, double wall_ms) {
  std::printf("%-20s %-10s %-7s %5d %6d %9.3f", name, impl, phase, batch, tokens, wall_ms);
  for (double ms : s.ms) std::printf(" %8.3f", ms);
  const double kernels = Kernels(s);
  std::printf(" %8.3f %6.2f\n", kernels, kernels > 0 ? wall_ms / kernels : 0.0);
}

int RunCase(AttentionBackend& backend, const char* impl, const BenchCase& c, bool quick) {
  LayerSpec spec;
  spec.variant = c.kv_heads == c.heads ? AttentionVariant::kMHA
                 : c.kv_heads == 1     ? AttentionVariant::kMQA
                                       : AttentionVariant::kGQA;
  spec.d_model = c.d_model;
  spec.num_heads = c.heads;
  spec.num_kv_heads = c.kv_heads;
  spec.head_dim = c.head_dim;
  spec.rope = RopeLayout::kHalf;
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 7);
  if (!weights.ok()) return 1;
  absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
      backend.CreateLayer(spec, *weights, {c.kv, 16, int64_t{1} << 20, nullptr});
  if (!layer.ok()) {
    std::printf("%s: %s\n", c.name, layer.status().ToString().c_str());
    return 1;
  }
  auto* timed = dynamic_cast<cuda::CudaLayerBase*>(layer->get());  // Either layer kind.
  if (timed == nullptr) return 1;
  timed->EnableStageTiming(true);
  std::mt19937_64 rng(11);
  const DType wire = c.kv == DType::kF32 ? DType::kF32 : c.kv;
  std::vector<SequenceId> ids;
  for (int b = 0; b < c.batch; ++b) ids.push_back((*layer)->CreateSequence());
  // Prefill every sequence's context, one sequence per call (the calls after the first are timed).
  std::vector<LayerCallStages> prefill;
  std::vector<double> prefill_wall;
  for (int b = 0; b < c.batch; ++b) {
    const Tensor hidden = reference::ToTensor(
        reference::RandomHidden(c.context, c.d_model, rng), {c.context, c.d_model}, wire);
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<Tensor> out = (*layer)->Prefill({{ids[b], c.context}}, hidden, {});
    const auto t1 = std::chrono::steady_clock::now();
    if (!out.ok()) {
      std::printf("%s prefill: %s\n", c.name, out.status().ToString().c_str());
      return 1;
    }
    if (b > 0) {
      prefill.push_back(timed->last_call_stages());
      prefill_wall.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
  const Tensor step = reference::ToTensor(reference::RandomHidden(c.batch, c.d_model, rng),
                                          {c.batch, c.d_model}, wire);
  std::vector<LayerCallStages> decode;
  std::vector<double> decode_wall;
  const int steps = quick ? 10 : 30;
  for (int s = 0; s < steps + 3; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<Tensor> out = (*layer)->Decode(ids, step, {});
    const auto t1 = std::chrono::steady_clock::now();
    if (!out.ok()) {
      std::printf("%s decode: %s\n", c.name, out.status().ToString().c_str());
      return 1;
    }
    if (s >= 3) {
      decode.push_back(timed->last_call_stages());
      decode_wall.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  if (!prefill.empty()) {
    PrintRow(c.name, impl, "prefill", 1, c.context, MedianStages(prefill), median(prefill_wall));
  }
  PrintRow(c.name, impl, "decode", c.batch, c.context, MedianStages(decode), median(decode_wall));
  return 0;
}

int Run(bool quick) {
  std::vector<CudaAttentionImpl> impls = {CudaAttentionImpl::kNative};
  if (FlashInferBuilt()) impls.push_back(CudaAttentionImpl::kFlashInfer);
  const std::vector<BenchCase> cases = {
      {"gqa32x8_hd128_bf16", 32, 8, 128, 4096, DType::kBF16, quick ? 8 : 32, quick ? 1024 : 4096},
      {"mha32_hd128_bf16", 32, 32, 128, 4096, DType::kBF16, 8, quick ? 1024 : 4096},
      {"mqa16_hd64_f16", 16, 1, 64, 1024, DType::kF16, quick ? 16 : 64, quick ? 1024 : 8192},
      {"gqa32x8_hd128_f32", 32, 8, 128, 4096, DType::kF32, 8, quick ? 512 : 2048},
  };
  bool header = false;
  int failures = 0;
  for (CudaAttentionImpl impl : impls) {
    CudaBackendOptions options;
    options.kv_pool_bytes = int64_t{16} << 30;
    options.attention = impl;
    absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCudaBackend(options);
    if (!backend.ok()) {
      std::printf("no usable CUDA device, benchmark skipped: %s\n",
                  backend.status().ToString().c_str());
      return 0;
    }
    if (!header) {
      std::printf("%s\n", (*backend)->device_description().c_str());
      std::printf("%-20s %-10s %-7s %5s %6s %9s", "case", "impl", "phase", "batch", "tokens",
                  "wall_ms");
      for (int s = 0; s < static_cast<int>(LayerStage::kCount); ++s) {
        std::printf(" %8s", cuda::LayerStageName(static_cast<LayerStage>(s)));
      }
      std::printf(" %8s %6s\n", "kernels", "x");
      header = true;
    }
    for (const BenchCase& c : cases) {
      // f32 pages run the native kernels under either implementation: measured once.
      if (impl == CudaAttentionImpl::kFlashInfer && c.kv == DType::kF32) continue;
      failures += RunCase(**backend, CudaAttentionImplName(impl), c, quick);
    }
  }
  std::printf(
      "wall_ms: one synchronous call (prefill: one sequence of `tokens`; decode: one step of the "
      "whole batch at context `tokens`), median; stage columns: the layer's StageTimer, each "
      "stage's median (host: plan, stage, finish; device: CUDA events); kernels = qkv_gemm + "
      "rope_append + attention + o_gemm; x = wall_ms / kernels (target <= 1.3).\n");
  return failures > 0 ? 1 : 0;
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  return attnserve::Run(quick);
}

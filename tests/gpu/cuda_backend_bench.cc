// attnserve_cuda_bench: wall-clock timings of the CUDA backend's Prefill and Decode calls (each
// call is synchronous: host plan, upload, kernels, download), median of repeated calls after a
// warm-up. Prints one table. Exits 0 with a note when there is no usable CUDA device.
//
//   attnserve_cuda_bench [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/runtime/cuda_backend.h"
#include "kernels/model/layer_weights.h"
#include "tests/reference/attention_reference.h"

namespace attnserve {
namespace {

struct BenchCase {
  const char* name;
  int heads, kv_heads, head_dim, d_model;
  DType kv;
  int batch;
  int context;  // Tokens cached per sequence before decode.
  int prefill;  // Tokens per sequence in the timed prefill.
};

double MedianMs(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run(bool quick) {
  CudaBackendOptions options;
  options.kv_pool_bytes = int64_t{8} << 30;
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCudaBackend(options);
  if (!backend.ok()) {
    std::printf("no usable CUDA device, benchmark skipped: %s\n",
                backend.status().ToString().c_str());
    return 0;
  }
  std::printf("%s\n", (*backend)->device_description().c_str());
  const std::vector<BenchCase> cases = {
      {"gqa32x8_hd128_bf16", 32, 8, 128, 4096, DType::kBF16, 32, quick ? 1024 : 4096, 1024},
      {"mha32_hd128_bf16", 32, 32, 128, 4096, DType::kBF16, 8, quick ? 1024 : 4096, 1024},
      {"mqa16_hd64_f16", 16, 1, 64, 1024, DType::kF16, 64, quick ? 1024 : 8192, 512},
      {"gqa32x8_hd128_f32", 32, 8, 128, 4096, DType::kF32, 8, 2048, 512},
  };
  std::printf("%-22s %5s %7s %12s %14s %12s %14s\n", "case", "batch", "context", "prefill_ms",
              "prefill_tok/s", "decode_ms", "decode_tok/s");
  for (const BenchCase& c : cases) {
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
        (*backend)->CreateLayer(spec, *weights, {c.kv, 16, int64_t{1} << 20, nullptr});
    if (!layer.ok()) {
      std::printf("%s: %s\n", c.name, layer.status().ToString().c_str());
      return 1;
    }
    std::mt19937_64 rng(11);
    std::vector<SequenceId> ids;
    std::vector<PrefillChunk> chunks;
    for (int b = 0; b < c.batch; ++b) {
      ids.push_back((*layer)->CreateSequence());
      chunks.push_back({ids.back(), c.context});
    }
    // Fill the context in chunks of at most 8192 rows per call.
    std::vector<double> prefill_ms;
    for (size_t b = 0; b < chunks.size();) {
      std::vector<PrefillChunk> part;
      int64_t rows = 0;
      while (b < chunks.size() && (part.empty() || rows + c.context <= 8192)) {
        part.push_back(chunks[b++]);
        rows += c.context;
      }
      const Tensor hidden = reference::ToTensor(reference::RandomHidden(rows, c.d_model, rng),
                                                {rows, c.d_model}, DType::kBF16);
      const auto t0 = std::chrono::steady_clock::now();
      absl::StatusOr<Tensor> out = (*layer)->Prefill(part, hidden, {});
      const auto t1 = std::chrono::steady_clock::now();
      if (!out.ok()) {
        std::printf("%s prefill: %s\n", c.name, out.status().ToString().c_str());
        return 1;
      }
      if (rows == int64_t{c.context} * static_cast<int64_t>(part.size()) && b > 1) {
        prefill_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() /
                             static_cast<double>(part.size()));
      }
    }
    const Tensor step = reference::ToTensor(reference::RandomHidden(c.batch, c.d_model, rng),
                                            {c.batch, c.d_model}, DType::kBF16);
    std::vector<double> decode_ms;
    const int steps = quick ? 10 : 30;
    for (int s = 0; s < steps + 3; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      absl::StatusOr<Tensor> out = (*layer)->Decode(ids, step, {});
      const auto t1 = std::chrono::steady_clock::now();
      if (!out.ok()) {
        std::printf("%s decode: %s\n", c.name, out.status().ToString().c_str());
        return 1;
      }
      if (s >= 3) decode_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    const double p = prefill_ms.empty() ? 0.0 : MedianMs(prefill_ms);
    const double dms = MedianMs(decode_ms);
    std::printf("%-22s %5d %7d %12.3f %14.0f %12.3f %14.0f\n", c.name, c.batch, c.context, p,
                p > 0 ? c.context / (p / 1e3) : 0.0, dms, c.batch / (dms / 1e3));
  }
  std::printf(
      "prefill_ms: per sequence of `context` tokens (median over calls after the first);"
      " decode_ms: one step of the whole batch. Wall clock per synchronous call.\n");
  return 0;
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  return attnserve::Run(quick);
}

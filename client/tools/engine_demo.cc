// The engine's demo: for each attention variant at d_model 512 / 8 heads, print its parameter
// count, KV-cache bytes per token, and prefill and decode times on this machine's CPU backend.
// A quick look, not a benchmark: tests/benchmarks has the measured ratios.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/common/demo_variants.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef ATTNSERVE_HAVE_CUDA
#include "kernels/cuda/runtime/cuda_device.h"
#endif

ABSL_FLAG(int, d_model, 512, "Hidden size of every variant.");
ABSL_FLAG(int, num_heads, 8, "Query heads of every variant.");
ABSL_FLAG(int, batch, 4, "Sequences per prefill and per decode step.");
ABSL_FLAG(std::string, seq_lens, "128,512,2048", "Prompt lengths, comma separated.");
ABSL_FLAG(int, decode_steps, 16, "Decode steps timed after each prefill.");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache storage: f32 or bf16.");
ABSL_FLAG(int, window, 0, "Sliding window (0 = full attention).");
ABSL_FLAG(int, threads, 0, "CPU threads (0 = all).");
ABSL_FLAG(uint64_t, seed, 1, "Weight seed.");

namespace attnserve {
namespace {

struct Timing {
  double prefill_ms = 0;
  double decode_ms_per_step = 0;
};

absl::StatusOr<Timing> TimeVariant(AttentionBackend& backend, const LayerSpec& spec, DType kv_dtype,
                                   int batch, int seq_len, int decode_steps, uint64_t seed) {
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, seed);
  if (!weights.ok()) return weights.status();
  KvCacheConfig kv;
  kv.storage = kv_dtype;
  const int page_size = DefaultPageSize(spec);
  kv.max_pages = int64_t{batch} * ((seq_len + decode_steps) / page_size + 2);
  absl::StatusOr<std::unique_ptr<AttentionLayer>> layer = backend.CreateLayer(spec, *weights, kv);
  if (!layer.ok()) return layer.status();

  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  auto random_hidden = [&](int64_t rows) {
    std::vector<float> values(rows * spec.d_model);
    for (float& v : values) v = normal(rng);
    return Tensor::FromFloats({rows, spec.d_model}, values);
  };
  std::vector<SequenceId> ids;
  std::vector<PrefillChunk> chunks;
  for (int b = 0; b < batch; ++b) {
    ids.push_back((*layer)->CreateSequence());
    chunks.push_back({ids.back(), seq_len});
  }
  Timing timing;
  const Tensor prompt = random_hidden(int64_t{batch} * seq_len);
  absl::Time start = absl::Now();
  absl::StatusOr<Tensor> out = (*layer)->Prefill(chunks, prompt, {});
  if (!out.ok()) return out.status();
  timing.prefill_ms = absl::ToDoubleMilliseconds(absl::Now() - start);

  const Tensor step = random_hidden(batch);
  start = absl::Now();
  for (int i = 0; i < decode_steps; ++i) {
    out = (*layer)->Decode(ids, step, {});
    if (!out.ok()) return out.status();
  }
  timing.decode_ms_per_step =
      absl::ToDoubleMilliseconds(absl::Now() - start) / std::max(1, decode_steps);
  return timing;
}

int Run() {
  absl::StatusOr<DType> kv_dtype = ParseDType(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) {
    std::fprintf(stderr, "--kv_dtype: %s\n", std::string(kv_dtype.status().message()).c_str());
    return 2;
  }
  std::vector<int> seq_lens;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_seq_lens), ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value < 1) {
      std::fprintf(stderr, "--seq_lens: '%s' is not a positive integer\n",
                   std::string(part).c_str());
      return 2;
    }
    seq_lens.push_back(value);
  }
#ifdef ATTNSERVE_HAVE_CUDA
  if (absl::StatusOr<std::vector<CudaDeviceInfo>> gpus = ListCudaDevices(); gpus.ok()) {
    for (const CudaDeviceInfo& gpu : *gpus) {
      absl::PrintF(
          "GPU %d: %s (sm_%d, %.1f GiB); this demo times the CPU backend (the server's "
          "--backend=cuda uses the GPU)\n",
          gpu.ordinal, gpu.name, gpu.compute_capability, gpu.total_memory_bytes / double(1 << 30));
    }
  } else {
    absl::PrintF("%s; using the CPU backend\n", gpus.status().message());
  }
#else
  absl::PrintF("built without CUDA; using the CPU backend\n");
#endif
  CpuBackendOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend(options);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  const int batch = absl::GetFlag(FLAGS_batch);
  const int steps = absl::GetFlag(FLAGS_decode_steps);
  const std::vector<NamedSpec> variants = DemoVariants(
      absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_num_heads), absl::GetFlag(FLAGS_window));

  absl::PrintF("attnserve engine demo — backend %s (%s), KV cache %s, batch %d\n\n",
               (*backend)->name(), (*backend)->device_description(), DTypeName(*kv_dtype), batch);
  absl::PrintF("%-8s %10s %14s %14s  %s\n", "variant", "params", "KV bytes/tok", "vs MHA", "spec");
  const int64_t mha_bytes = KvBytesPerToken(variants.front().spec, *kv_dtype);
  for (const NamedSpec& v : variants) {
    const int64_t bytes = KvBytesPerToken(v.spec, *kv_dtype);
    absl::PrintF("%-8s %10d %14d %13.1f%%  %s\n", v.label, ParameterCount(v.spec), bytes,
                 100.0 * bytes / mha_bytes, LayerSpecSummary(v.spec));
  }
  absl::PrintF("\n%-8s %8s %14s %18s %16s\n", "variant", "seq_len", "prefill ms", "decode ms/step",
               "KV MiB (batch)");
  for (const NamedSpec& v : variants) {
    for (int seq_len : seq_lens) {
      absl::StatusOr<Timing> timing = TimeVariant(**backend, v.spec, *kv_dtype, batch, seq_len,
                                                  steps, absl::GetFlag(FLAGS_seed));
      if (!timing.ok()) {
        std::fprintf(stderr, "%s seq %d: %s\n", v.label.c_str(), seq_len,
                     timing.status().ToString().c_str());
        return 1;
      }
      const double kv_mib = static_cast<double>(KvBytesPerToken(v.spec, *kv_dtype)) * batch *
                            (seq_len + steps) / (1 << 20);
      absl::PrintF("%-8s %8d %14.2f %18.3f %16.2f\n", v.label, seq_len, timing->prefill_ms,
                   timing->decode_ms_per_step, kv_mib);
    }
  }
  return 0;
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  // The demo times the engine in this process: on a CPU its OpenBLAS does not know, with the
  // kernels the server would run (kernels/cpu/blas_core.h).
  attnserve::ReexecForBetterBlasCore(argv);
  absl::ParseCommandLine(argc, argv);
  return attnserve::Run();
}

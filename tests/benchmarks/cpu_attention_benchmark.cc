// CPU backend benchmarks, each next to a ceiling measured in the same run:
//   BM_SgemmCeiling  - OpenBLAS sgemm on every thread at once (GFLOP/s the projections can reach)
//   BM_CopyCeiling   - a 512 MiB memcpy split over every thread (bytes read + written per second)
//   BM_ReadCeiling/<bytes> - a read-only sum of <bytes> over every thread, read again and again
//                      (bytes read per second): 512 MiB is the memory's ceiling; the others are
//                      each decode row's KV footprint, read from whichever cache level holds it,
//                      the ceiling that row can approach (a 134 MB cache fits a 260 MiB L3)
//   BM_Prefill       - whole-sequence prefill per variant: useful GFLOP/s
//   BM_Decode        - one decode step per variant at a long context: GB/s of KV read
//   BM_DecodeAttention - the paged decode attention kernel alone at BM_Decode's shapes (no
//                      projections, no KV append): GB/s of KV read, for the read-ceiling ratio
//   (BM_Decode and BM_DecodeAttention report kv_bytes, their footprint: the BM_ReadCeiling arg
//   that judges them)
//   BM_PrefillAttention - the prefill attention kernel alone at BM_Prefill's shapes (causal, f32
//                      keys and values already gathered in memory; no projections): useful GFLOP/s
//   BM_SmolStep      - one decode step of a SmolLM2-135M layer at a short context (the per-step
//                      fixed cost): bytes of weights + KV read per second, against BM_ReadCeiling
//   BM_SmolDecodeAttention - BM_SmolDecode's kernel alone at 512 x 64 (3 query rows per KV head)
// tests/benchmarks/run_cpu_benchmarks.py turns the JSON output into the ratio table of
// docs/benchmarks.md.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "client/common/demo_variants.h"
#include "kernels/core/tensor.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/gqa_layer.h"
#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mla_layer.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/cpu/simd_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace attnserve {
namespace {

constexpr int kDModel = 512;
constexpr int kHeads = 8;

// ATTNSERVE_BENCH_THREADS=N runs the engine on N threads (run_cpu_benchmarks.py --threads_table
// runs 1 and all); default: one per hardware thread.
int Threads() {
  const char* threads = std::getenv("ATTNSERVE_BENCH_THREADS");
  if (threads != nullptr && std::atoi(threads) > 0) return std::atoi(threads);
  return std::max(1u, std::thread::hardware_concurrency());
}

AttentionBackend& Backend() {
  static AttentionBackend* backend = CreateCpuBackend({.num_threads = Threads()}).value().release();
  return *backend;
}

const NamedSpec& Variant(int64_t index) {
  static const std::vector<NamedSpec> variants = DemoVariants(kDModel, kHeads, /*window=*/0);
  return variants[index];
}

Tensor RandomHidden(int64_t rows, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> values(rows * kDModel);
  for (float& v : values) v = normal(rng);
  return Tensor::FromFloats({rows, kDModel}, values);
}

// FLOPs of a causal prefill of `length` tokens (multiply-adds count 2), projections included.
double PrefillFlops(const LayerSpec& s, int64_t length) {
  const double d = s.d_model, h = s.num_heads, n = static_cast<double>(length);
  const double visible_pairs = n * (n + 1) / 2;  // Sum over queries of visible keys.
  if (s.variant == AttentionVariant::kMLA) {
    const MlaDims& m = s.mla;
    const double qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const double projections = 2 * n * d * h * qk +
                               2 * n * d * (m.kv_lora_rank + m.qk_rope_head_dim) +
                               2 * n * m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim) +
                               2 * n * h * m.v_head_dim * d;
    return projections + 2 * h * (qk + m.v_head_dim) * visible_pairs;
  }
  const double hd = s.head_dim, kv = s.num_kv_heads;
  const double projections = 2 * n * d * (h * hd + 2 * kv * hd) + 2 * n * h * hd * d;
  return projections + 4 * h * hd * visible_pairs;
}

void BM_SgemmCeiling(benchmark::State& state) {
  const int n = 512;
  const int threads = Threads();
  ThreadPool pool(threads);
  std::vector<std::vector<float>> a(threads, std::vector<float>(n * n, 1.0f)),
      b(threads, std::vector<float>(n * n, 0.5f)), c(threads, std::vector<float>(n * n));
  for (auto _ : state) {
    pool.ParallelFor(threads, [&](int64_t t) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a[t].data(), n,
                  b[t].data(), n, 0.0f, c[t].data(), n);
    });
    benchmark::DoNotOptimize(c[0].data());
  }
  state.counters["GFLOPs"] = benchmark::Counter(
      2.0 * n * n * n * threads * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SgemmCeiling)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_CopyCeiling(benchmark::State& state) {
  const size_t bytes = size_t{512} << 20;
  const int threads = Threads();
  ThreadPool pool(threads);
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    pool.ParallelFor(threads, [&](int64_t t) {
      const size_t begin = bytes * t / threads, end = bytes * (t + 1) / threads;
      std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
    });
    benchmark::DoNotOptimize(dst.data());
  }
  // A copy reads and writes every byte: count both, as the memory system must move both.
  state.counters["GBps"] =
      benchmark::Counter(2.0 * bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CopyCeiling)->UseRealTime()->Unit(benchmark::kMillisecond);

// The decode rows (BM_Decode; BM_DecodeAttention runs the 4096 x 8 and 512 x 64 ones): variant
// index, context length, KV dtype (0 f32, 1 bf16), batch.
std::vector<std::vector<int64_t>> DecodeRows() {
  std::vector<std::vector<int64_t>> rows;
  for (int64_t variant : {0, 1, 2, 3}) {
    for (int64_t kv : {0, 1}) rows.push_back({variant, 4096, kv, 8});
  }
  rows.push_back({0, 1024, 0, 1});
  // Issue 23's attnbench shape (GQA-4 and MQA, context 512): a decode batch of 64 against 64
  // single steps is the engine's share of the 64-stream gain.
  for (int64_t variant : {1, 2}) {
    for (int64_t batch : {1, 64}) rows.push_back({variant, 512, 0, batch});
  }
  return rows;
}

bool IsLongDecodeRow(const std::vector<int64_t>& row) { return row[1] == 4096 && row[3] == 8; }

// The batching shape: many short sequences, where per-sequence costs weigh most.
bool IsWideDecodeRow(const std::vector<int64_t>& row) { return row[1] == 512 && row[3] == 64; }

// The KV bytes a decode row reads per step (at its first step's context): its footprint.
int64_t DecodeKvBytes(int64_t variant, int64_t context, int64_t kv_dtype, int64_t batch) {
  return batch * context *
         KvBytesPerToken(Variant(variant).spec, kv_dtype ? DType::kBF16 : DType::kF32);
}

// BM_SmolDecodeAttention's footprint (defined with SmolLM2's shapes below).
int64_t SmolDecodeAttentionKvBytes();

constexpr int64_t kMemoryReadBytes = int64_t{512} << 20;  // Far above any L3: from memory.

// Decode only reads the cache, so a read-only sweep is its tightest ceiling, measured at the
// memory (512 MiB) and at each decode row's footprint: read again and again, a footprint that fits
// in a cache level is read from there (this machine's 260 MiB L3 holds every 4096 x 8 cache), so
// the row's ratio to the 512 MiB ceiling could pass 100% and mean nothing. Every thread reads its
// own share of the bytes each pass, as the decode kernel's threads read theirs.
void BM_ReadCeiling(benchmark::State& state) {
  const size_t words = static_cast<size_t>(state.range(0)) / sizeof(uint64_t);
  // Passes per fan-out: at least 64 MiB read per ParallelFor, so a small footprint's rate is its
  // cache's, not the pool's hand-off.
  const int64_t passes = std::max<int64_t>(1, (int64_t{64} << 20) / state.range(0));
  const int threads = Threads();
  ThreadPool pool(threads);
  std::vector<uint64_t> data(words, 1);
  std::vector<uint64_t> folds(threads);
  for (auto _ : state) {
    pool.ParallelFor(threads, [&](int64_t t) {
      // An integer XOR fold: reassociable, so the compiler unrolls and vectorises it freely and
      // the loop runs at the memory's pace rather than an add chain's latency.
      const size_t begin = words * t / threads, end = words * (t + 1) / threads;
      for (int64_t pass = 0; pass < passes; ++pass) {
        uint64_t fold = 0;
        for (size_t i = begin; i < end; ++i) fold ^= data[i];
        folds[t] += fold;
        benchmark::ClobberMemory();  // Each pass reads the bytes again.
      }
    });
    benchmark::DoNotOptimize(folds.data());
  }
  state.counters["GBps"] = benchmark::Counter(
      8.0 * static_cast<double>(words) * static_cast<double>(passes * state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReadCeiling)
    ->Apply([](benchmark::internal::Benchmark* b) {
      std::vector<int64_t> sizes = {kMemoryReadBytes};
      for (const std::vector<int64_t>& row : DecodeRows()) {
        const int64_t bytes = DecodeKvBytes(row[0], row[1], row[2], row[3]);
        if (std::find(sizes.begin(), sizes.end(), bytes) == sizes.end()) sizes.push_back(bytes);
      }
      sizes.push_back(SmolDecodeAttentionKvBytes());
      for (int64_t bytes : sizes) b->Arg(bytes);
    })
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Args: variant index, sequence length, KV dtype (0 f32, 1 bf16).
void BM_Prefill(benchmark::State& state) {
  const NamedSpec& variant = Variant(state.range(0));
  const int64_t length = state.range(1);
  KvCacheConfig kv;
  kv.storage = state.range(2) ? DType::kBF16 : DType::kF32;
  kv.max_pages = length / DefaultPageSize(variant.spec) + 2;
  auto layer = Backend().CreateLayer(variant.spec, *RandomLayerWeights(variant.spec, 1), kv);
  std::mt19937 rng(1);
  const Tensor hidden = RandomHidden(length, rng);
  for (auto _ : state) {
    const SequenceId id = (*layer)->CreateSequence();
    const PrefillChunk chunk{id, length};
    benchmark::DoNotOptimize((*layer)->Prefill({&chunk, 1}, hidden, {}));
    (void)(*layer)->ReleaseSequence(id);
  }
  state.SetLabel(absl::StrCat(variant.label, " kv=", DTypeName(kv.storage.element)));
  state.counters["GFLOPs"] = benchmark::Counter(
      PrefillFlops(variant.spec, length) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Prefill)
    ->ArgsProduct({{0, 1, 2, 3}, {512, 2048}, {0}})
    ->Args({0, 2048, 1})
    ->Args({3, 2048, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Keys and values of one sequence as float32 rows [length][kv_heads][dim], random.
class RandomKvSource : public KvBlockSource {
 public:
  RandomKvSource(int64_t length, int kv_heads, int dim)
      : kv_heads_(kv_heads), dim_(dim), kv_(2 * length * kv_heads * dim) {
    std::mt19937 rng(2);
    std::normal_distribution<float> normal;
    for (float& x : kv_) x = normal(rng);
  }
  void Fill(int kv_head, int64_t begin, int64_t end, float* keys, float* values) const override {
    const int64_t half = static_cast<int64_t>(kv_.size()) / 2;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = (i * kv_heads_ + kv_head) * dim_;
      std::memcpy(keys + (i - begin) * dim_, &kv_[row], dim_ * sizeof(float));
      std::memcpy(values + (i - begin) * dim_, &kv_[half + row], dim_ * sizeof(float));
    }
  }

 private:
  int kv_heads_, dim_;
  std::vector<float> kv_;
};

// Args: variant index (MHA, GQA-4, MQA), sequence length.
void BM_PrefillAttention(benchmark::State& state) {
  const LayerSpec& spec = Variant(state.range(0)).spec;
  const int64_t length = state.range(1);
  const int heads = spec.num_heads, dim = spec.head_dim;
  static ThreadPool* pool = new ThreadPool(Threads());
  const RandomKvSource source(length, spec.num_kv_heads, dim);
  std::vector<float> q(length * heads * dim), out(length * heads * dim);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& x : q) x = normal(rng);
  PrefillAttentionParams p;
  p.q = q.data();
  p.q_row_stride = int64_t{heads} * dim;
  p.out = out.data();
  p.out_row_stride = int64_t{heads} * dim;
  p.num_kv_heads = spec.num_kv_heads;
  p.group_size = heads / spec.num_kv_heads;
  p.key_dim = dim;
  p.value_dim = dim;
  p.variation.scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const PrefillSequence sequence{0, length, 0, length, &source};
  for (auto _ : state) {
    PrefillAttention(p, {&sequence, 1}, *pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(Variant(state.range(0)).label);
  const double pairs = static_cast<double>(length) * (length + 1) / 2;
  state.counters["GFLOPs"] = benchmark::Counter(4.0 * heads * dim * pairs * state.iterations() / 1e9,
                                                benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PrefillAttention)
    ->ArgsProduct({{0, 1, 2}, {2048}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Args: variant index, context length, KV dtype (0 f32, 1 bf16), batch.
// The contexts are filled once by prefill (O(context^2), the slow part of this benchmark) and then
// grow by one token per timed step; kMaxSteps bounds that growth.
void BM_Decode(benchmark::State& state) {
  const NamedSpec& variant = Variant(state.range(0));
  const int64_t context = state.range(1);
  const int batch = static_cast<int>(state.range(3));
  constexpr int64_t kMaxSteps = 4096;
  KvCacheConfig kv;
  kv.storage = state.range(2) ? DType::kBF16 : DType::kF32;
  kv.max_pages = batch * ((context + kMaxSteps) / DefaultPageSize(variant.spec) + 2);
  auto layer = Backend().CreateLayer(variant.spec, *RandomLayerWeights(variant.spec, 1), kv);
  std::mt19937 rng(1);
  const Tensor prompt = RandomHidden(context, rng);
  const Tensor step = RandomHidden(batch, rng);
  std::vector<SequenceId> ids;
  for (int b = 0; b < batch; ++b) {
    ids.push_back((*layer)->CreateSequence());
    const PrefillChunk chunk{ids.back(), context};
    if (!(*layer)->Prefill({&chunk, 1}, prompt, {}).ok()) state.SkipWithError("prefill failed");
  }
  int64_t steps = 0;
  double kv_bytes = 0;
  for (auto _ : state) {
    absl::StatusOr<Tensor> out = (*layer)->Decode(ids, step, {});
    if (!out.ok()) {
      state.SkipWithError(std::string(out.status().message()).c_str());
      break;
    }
    ++steps;
    kv_bytes +=
        static_cast<double>(batch) * (context + steps) * KvBytesPerToken(variant.spec, kv.storage.element);
  }
  state.SetLabel(absl::StrCat(variant.label, " kv=", DTypeName(kv.storage.element)));
  state.counters["KV_GBps"] = benchmark::Counter(kv_bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["kv_bytes"] =
      static_cast<double>(DecodeKvBytes(state.range(0), context, state.range(2), batch));
}
BENCHMARK(BM_Decode)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (const std::vector<int64_t>& row : DecodeRows()) b->Args(row);
    })
    ->UseRealTime()
    ->Iterations(64)
    ->Unit(benchmark::kMillisecond);

// The paged decode kernel alone for `spec`: random pages, each sequence's pages allocated in order
// (as a prefill leaves them); the same step every iteration.
void RunDecodeAttention(benchmark::State& state, const LayerSpec& spec, const std::string& label,
                        int64_t context, DType storage, int batch) {
  KvCacheConfig kv;
  kv.storage = storage;
  kv.page_size = DefaultPageSize(spec);
  const bool mla = spec.variant == AttentionVariant::kMLA;
  DecodeAttentionParams p;
  p.layout = mla ? MlaLayer::MakePageLayout(spec, kv) : GqaLayer::MakePageLayout(spec, kv);
  p.num_kv_heads = mla ? 1 : spec.num_kv_heads;
  p.rows_per_kv_head = mla ? spec.num_heads : spec.num_heads / spec.num_kv_heads;
  p.key_dim = mla ? spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim : spec.head_dim;
  p.value_dim = mla ? spec.mla.kv_lora_rank : spec.head_dim;
  p.variation.scale = 1.0f / std::sqrt(static_cast<float>(p.key_dim));
  p.batch = batch;
  HostPageStore store(p.layout.page_elements * DTypeSize(kv.storage.element));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> page_values(p.layout.page_elements);
  std::vector<PageTable> tables(batch);
  int32_t next_page = 0;
  for (PageTable& table : tables) {
    table.num_tokens = context;
    for (int64_t i = 0; i < PagesForTokens(context, kv.page_size); ++i) {
      table.pages.push_back(next_page++);
    }
    if (!store.Commit(table.pages).ok()) state.SkipWithError("commit failed");
    for (int32_t id : table.pages) {
      for (float& v : page_values) v = normal(rng);
      ConvertFromFloat(page_values.data(), kv.storage.element, store.page(id),
                       page_values.size());
    }
  }
  std::vector<const PageTable*> table_pointers;
  for (const PageTable& table : tables) table_pointers.push_back(&table);
  const int64_t rows = int64_t{batch} * p.num_kv_heads * p.rows_per_kv_head;
  std::vector<float> q(rows * p.key_dim), out(rows * p.value_dim);
  for (float& v : q) v = normal(rng);
  p.q = q.data();
  p.out = out.data();
  p.store = &store;
  p.tables = table_pointers;
  ThreadPool pool(Threads());
  for (auto _ : state) {
    PagedDecodeAttention(p, pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(absl::StrCat(label, " kv=", DTypeName(kv.storage.element)));
  const double kv_bytes =
      static_cast<double>(batch) * context * KvBytesPerToken(spec, kv.storage.element);
  state.counters["KV_GBps"] =
      benchmark::Counter(kv_bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["kv_bytes"] = kv_bytes;
}

// Args: variant index, context length, KV dtype (0 f32, 1 bf16), batch.
void BM_DecodeAttention(benchmark::State& state) {
  const NamedSpec& variant = Variant(state.range(0));
  RunDecodeAttention(state, variant.spec, variant.label, state.range(1),
                     state.range(2) ? DType::kBF16 : DType::kF32, static_cast<int>(state.range(3)));
}
BENCHMARK(BM_DecodeAttention)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (const std::vector<int64_t>& row : DecodeRows()) {
        if (IsLongDecodeRow(row) || IsWideDecodeRow(row)) b->Args(row);
      }
    })
    ->UseRealTime()
    ->Iterations(32)
    ->Unit(benchmark::kMillisecond);

// Args: weight dtype (0 f32, 1 bf16), rows. One thread's small-batch projection (SmolLM2's fused
// q/k/v: 576 -> 960 features, 2.2 MB f32) on the path this CPU chooses; run it again with
// ATTNSERVE_CPU_AVX512=0 for the AVX2 path. best_us: the fastest call (on shared cores, the one
// not interrupted).
void BM_SmallBatchGemv(benchmark::State& state) {
  constexpr int64_t kIn = 576, kOut = 960;
  const int64_t rows = state.range(1);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * kIn), w(kOut * kIn), y(rows * kOut);
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  std::vector<uint16_t> w16(w.size());
  ConvertFromFloat(w.data(), DType::kBF16, w16.data(), w.size());
  std::chrono::steady_clock::duration best = std::chrono::hours(1);
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    if (state.range(0) == 0) {
      SmallBatchGemv(x.data(), kIn, rows, w.data(), kIn, nullptr, 0, kOut, y.data(), kOut);
    } else {
      SmallBatchGemv(x.data(), kIn, rows, w16.data(), kIn, nullptr, 0, kOut, y.data(), kOut);
    }
    best = std::min(best, std::chrono::steady_clock::now() - start);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(absl::StrCat(SimdKernelsUseAvx512() ? "avx512" : "avx2",
                              state.range(0) ? " weights=bf16" : " weights=f32"));
  state.counters["best_us"] = std::chrono::duration<double, std::micro>(best).count();
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * rows * kIn * kOut * state.iterations() / 1e9,
                                                benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SmallBatchGemv)
    ->ArgsProduct({{0, 1}, {1, 4, 8}})
    ->UseRealTime()
    ->MinTime(0.3)
    ->Unit(benchmark::kMicrosecond);

// SmolLM2-135M's attention layer: d_model 576, 9 query / 3 KV heads, head_dim 64, RoPE.
LayerSpec SmolSpec() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 576;
  spec.num_heads = 9;
  spec.num_kv_heads = 3;
  spec.head_dim = 64;
  spec.rope = RopeLayout::kHalf;
  spec.rope_theta = 100000.0;
  spec.causal = true;
  return spec;
}

// Args: projection weight dtype (0 f32, 1 bf16), batch, layers. A decode step at a short context,
// where the projection weights (3.5 MB f32, 1.8 MB bf16 per layer) are most of what a step must
// read: the step's time against reading its weights and KV once at BM_ReadCeiling's rate is its
// fixed overhead. With 1 layer its weights stay in cache from step to step; with 30 (SmolLM2's
// count, 106 MB f32 / 53 MB bf16 in all, above the 33 MiB L3) each iteration steps through every
// layer in turn, so each layer's weights come from memory as in a served model. Contexts stay in
// [kContext, kContext + kRefill): every kRefill steps the sequences are re-prefilled outside the
// timing.
void BM_SmolStep(benchmark::State& state) {
  const LayerSpec spec = SmolSpec();
  const DType weights_dtype = state.range(0) ? DType::kBF16 : DType::kF32;
  const int batch = static_cast<int>(state.range(1));
  const int num_layers = static_cast<int>(state.range(2));
  constexpr int64_t kContext = 128, kRefill = 64;
  static AttentionBackend* backends[2] = {
      CreateCpuBackend({.num_threads = Threads()}).value().release(),
      CreateCpuBackend({.num_threads = Threads(), .projection_weights = DType::kBF16})
          .value()
          .release()};
  KvCacheConfig kv;
  kv.storage = DType::kF32;
  kv.max_pages = batch * ((kContext + kRefill) / DefaultPageSize(spec) + 2);
  std::vector<std::unique_ptr<AttentionLayer>> layers;
  for (int l = 0; l < num_layers; ++l) {
    layers.push_back(
        *backends[state.range(0)]->CreateLayer(spec, *RandomLayerWeights(spec, 1 + l), kv));
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> prompt_values(kContext * spec.d_model), step_values(batch * spec.d_model);
  for (float& v : prompt_values) v = normal(rng);
  for (float& v : step_values) v = normal(rng);
  const Tensor prompt = Tensor::FromFloats({kContext, spec.d_model}, prompt_values);
  const Tensor step = Tensor::FromFloats({batch, spec.d_model}, step_values);
  std::vector<std::vector<SequenceId>> ids(num_layers);
  auto refill = [&] {
    for (int l = 0; l < num_layers; ++l) {
      for (SequenceId id : ids[l]) (void)layers[l]->ReleaseSequence(id);
      ids[l].clear();
      for (int b = 0; b < batch; ++b) {
        const SequenceId id = ids[l].emplace_back(layers[l]->CreateSequence());
        const PrefillChunk chunk{id, kContext};
        if (!layers[l]->Prefill({&chunk, 1}, prompt, {}).ok()) {
          state.SkipWithError("prefill failed");
        }
      }
    }
  };
  refill();
  int64_t steps = 0;
  double bytes = 0;
  // The fastest single step: on cores shared with other work, the step that ran uninterrupted.
  std::chrono::steady_clock::duration best = std::chrono::hours(1);
  // No biases at this shape: every parameter is a projection weight.
  const double weight_bytes =
      static_cast<double>(ParameterCount(spec)) * static_cast<double>(DTypeSize(weights_dtype));
  for (auto _ : state) {
    if (steps == kRefill) {
      state.PauseTiming();
      refill();
      steps = 0;
      state.ResumeTiming();
    }
    const auto start = std::chrono::steady_clock::now();
    for (int l = 0; l < num_layers; ++l) {
      absl::StatusOr<Tensor> out = layers[l]->Decode(ids[l], step, {});
      if (!out.ok()) {
        state.SkipWithError(std::string(out.status().message()).c_str());
        return;
      }
    }
    best = std::min(best, std::chrono::steady_clock::now() - start);
    ++steps;
    bytes += num_layers * (weight_bytes + static_cast<double>(batch) * (kContext + steps) *
                                              KvBytesPerToken(spec, kv.storage.element));
  }
  state.SetLabel(absl::StrCat("SmolLM2-135M weights=", DTypeName(weights_dtype), " ctx=", kContext,
                              " batch=", batch, " layers=", num_layers));
  state.counters["GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["best_us"] = std::chrono::duration<double, std::micro>(best).count();
  state.counters["step_bytes"] = bytes / static_cast<double>(state.iterations());
}
BENCHMARK(BM_SmolStep)
    ->ArgsProduct({{0, 1}, {1, 8}, {1, 30}})
    ->UseRealTime()
    ->MinTime(0.5)
    ->Unit(benchmark::kMicrosecond);

Tensor RandomSmolHidden(int64_t rows, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> values(rows * SmolSpec().d_model);
  for (float& v : values) v = normal(rng);
  return Tensor::FromFloats({rows, SmolSpec().d_model}, values);
}

// Args: tokens. A SmolLM2-135M layer's prefill (f32 weights and KV), the row torch_cpu_peer.py
// runs through transformers' own LlamaAttention.
void BM_SmolPrefill(benchmark::State& state) {
  const LayerSpec spec = SmolSpec();
  const int64_t length = state.range(0);
  KvCacheConfig kv;
  kv.storage = DType::kF32;
  kv.max_pages = length / DefaultPageSize(spec) + 2;
  auto layer = Backend().CreateLayer(spec, *RandomLayerWeights(spec, 1), kv);
  std::mt19937 rng(1);
  const Tensor hidden = RandomSmolHidden(length, rng);
  for (auto _ : state) {
    const SequenceId id = (*layer)->CreateSequence();
    const PrefillChunk chunk{id, length};
    benchmark::DoNotOptimize((*layer)->Prefill({&chunk, 1}, hidden, {}));
    (void)(*layer)->ReleaseSequence(id);
  }
  state.SetLabel("SmolLM2-135M");
  state.counters["GFLOPs"] = benchmark::Counter(
      PrefillFlops(spec, length) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SmolPrefill)->Arg(512)->UseRealTime()->Unit(benchmark::kMillisecond);

// Args: context, batch. One decode step of `batch` SmolLM2-135M sequences at `context` tokens (f32
// weights and KV); the context grows by one token per step (32 steps).
void BM_SmolDecode(benchmark::State& state) {
  const LayerSpec spec = SmolSpec();
  const int64_t context = state.range(0);
  const int batch = static_cast<int>(state.range(1));
  constexpr int64_t kSteps = 32;
  KvCacheConfig kv;
  kv.storage = DType::kF32;
  kv.max_pages = batch * ((context + kSteps + 1) / DefaultPageSize(spec) + 2);
  auto layer = Backend().CreateLayer(spec, *RandomLayerWeights(spec, 1), kv);
  std::mt19937 rng(1);
  const Tensor prompt = RandomSmolHidden(context, rng);
  const Tensor step = RandomSmolHidden(batch, rng);
  std::vector<SequenceId> ids;
  for (int b = 0; b < batch; ++b) {
    ids.push_back((*layer)->CreateSequence());
    const PrefillChunk chunk{ids.back(), context};
    if (!(*layer)->Prefill({&chunk, 1}, prompt, {}).ok()) state.SkipWithError("prefill failed");
  }
  for (auto _ : state) {
    absl::StatusOr<Tensor> out = (*layer)->Decode(ids, step, {});
    if (!out.ok()) {
      state.SkipWithError(std::string(out.status().message()).c_str());
      break;
    }
  }
  state.SetLabel("SmolLM2-135M");
}
BENCHMARK(BM_SmolDecode)
    ->ArgsProduct({{512}, {1, 8, 64}})
    ->UseRealTime()
    ->Iterations(32)
    ->Unit(benchmark::kMillisecond);

// BM_SmolDecode's attention kernel alone (3 query rows per KV head), f32 KV, at 512 x 64.
constexpr int64_t kSmolKernelContext = 512;
constexpr int kSmolKernelBatch = 64;

int64_t SmolDecodeAttentionKvBytes() {
  return kSmolKernelBatch * kSmolKernelContext * KvBytesPerToken(SmolSpec(), DType::kF32);
}

// Args: context, batch (the one shape above, whose footprint BM_ReadCeiling measures).
void BM_SmolDecodeAttention(benchmark::State& state) {
  RunDecodeAttention(state, SmolSpec(), "SmolLM2-135M", state.range(0), DType::kF32,
                     static_cast<int>(state.range(1)));
}
BENCHMARK(BM_SmolDecodeAttention)
    ->Args({kSmolKernelContext, kSmolKernelBatch})
    ->UseRealTime()
    ->Iterations(32)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace attnserve

// BENCHMARK_MAIN, after OpenBLAS's kernels and threads are settled as the server settles them
// (blas_core.h; the backend runs OpenBLAS single-threaded inside its own pool): the sgemm ceiling
// and every projection are measured with the kernels the server runs. The ceiling runs before any
// backend exists; with OpenBLAS's own threads under each pool thread's sgemm, 0.3.34 (the wheel's)
// ran it at 1-13 GFLOP/s on the shared 2 cores against 32-97 single-threaded.
int main(int argc, char** argv) {
  attnserve::ReexecForBetterBlasCore(argv);
  attnserve::ConfigureBlasForBackend();
  benchmark::AddCustomContext("blas_kernels", attnserve::BlasCoreName());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// The blocked prefill attention kernel (kernels/cpu/prefill_attention.cc, tiles of
// kernels/cpu/prefill_tiles.h) through the CPU engine, against the independent float64 reference
// (tests/reference). ctest runs this binary three times: as is (AVX-512 where the CPU has it),
// with ATTNSERVE_CPU_AVX512=0 (AVX2) and with ATTNSERVE_CPU_PORTABLE=1 (the portable sgemm path);
// the catalogue of reference_test has mostly head dims the tiles do not take (8, 10, 24), so the
// specs here have head dims that are multiples of 16 and every variation prefill supports.
//
// Sizes cross every boundary of the kernel: 16-key panels, 512-key blocks (the kernel test's
// 1330-token sequence), 128-row query tiles (tokens × group), pages of 5 and 16 tokens; a
// sequence is prefilled whole (303 tokens) and, if
// causal, in two chunks (173 + 130: the second over a cached prefix that ends mid-panel and
// mid-page).
//
// Two levels:
//   PrefillTileKernelTest    the engine's layer (projections, RoPE, paged KV of every format the
//                            CPU stores) against ReferenceAttention, which has no soft-cap or
//                            sinks (peer_test checks those against transformers);
//   PrefillAttentionKernelTest  PrefillAttention alone on random q, k, v against a float64
//                            attention written here from the hooks' definitions, with soft-cap,
//                            sinks, ALiBi, windows, GQA groups and a cached prefix.
//
// Tolerances (relative, 2-norm over the whole output):
//   f32 KV:  1e-4 against the exact reference (as reference_test: float32 compute, dot products
//            of 16-64 terms, a stable softmax; a wrong mask or panel moves the output by > 1e-2).
//   bf16 KV: 4u = 1.6e-2 against exact (u = 2^-8), 2e-3 against the bf16-rounded reference, as in
//            reference_test.
//   int8 / fp8 KV: 5e-2 / 1e-1 against exact, kv_quantization_test's bounds (a value moves by at
//            most one step of its page's scale; fp8 keeps 3 mantissa bits).
//   Kernel alone (float32 q, k, v): 2e-5: float32 dot products of at most 80 terms and sums of at
//            most a few hundred weights (u = 6e-8), so errors are ~1e-6; a mask off by one key
//            moves the output by > 1e-3.
// The CPU backend stores no f16 KV (CreateLayer refuses it), so f16 pages are not a case.
#include "kernels/cpu/prefill_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/core/tensor.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv/storage_format.h"
#include "kernels/spec/layer_spec.h"
#include "tests/reference/attention_reference.h"
#include "tests/reference/test_cases.h"

namespace attnserve::reference {
namespace {

struct KvCase {
  std::string name;
  KvStorageFormat storage;
  double bound_exact;
  double bound_rounded;  // Against the reference with the cache rounded; 0: not checked.
};

const std::vector<KvCase>& KvCases() {
  static const std::vector<KvCase> cases = {
      {"f32", DType::kF32, 1e-4, 0.0},
      {"bf16", DType::kBF16, 4.0 / 256.0, 2e-3},
      {"int8", KvStorageFormat::Quantized(KvQuantization::kInt8), 5e-2, 0.0},
      {"fp8", KvStorageFormat::Quantized(KvQuantization::kFp8E4M3), 1e-1, 0.0},
  };
  return cases;
}

// Specs with head dims the tiles take, one per variation of prefill.
std::vector<NamedSpec> TileSpecs() {
  std::vector<NamedSpec> specs;
  const auto standard = [](int heads, int kv_heads, int head_dim, RopeLayout rope) {
    LayerSpec s = StandardSpec(heads, kv_heads, head_dim, rope);
    s.d_model = 128;
    return s;
  };
  specs.push_back({"mha_hd64", standard(2, 2, 64, RopeLayout::kHalf)});
  specs.push_back({"gqa4_hd32", standard(8, 2, 32, RopeLayout::kHalf)});
  {
    LayerSpec s = standard(8, 1, 16, RopeLayout::kNone);
    s.alibi = Alibi::kBloom;
    specs.push_back({"mqa_hd16_alibi", s});
  }
  {
    LayerSpec s = standard(4, 2, 48, RopeLayout::kInterleaved);
    s.sliding_window = 150;  // Cuts 256-key blocks and 16-key panels in the middle.
    specs.push_back({"gqa2_hd48_window150", s});
  }
  {
    LayerSpec s = standard(4, 4, 32, RopeLayout::kHalf);
    s.sliding_window = 40;  // Smaller than a block: whole blocks below the window are skipped.
    specs.push_back({"mha_hd32_window40", s});
  }
  {
    LayerSpec s = standard(2, 2, 32, RopeLayout::kHalf);
    s.causal = false;
    specs.push_back({"mha_hd32_noncausal", s});
  }
  // MLA: keys of nope + rope = 48, values of 32.
  specs.push_back({"mla_k48_v32", MlaSpec(0, 32, 32, 16, 32, RopeLayout::kHalf)});
  return specs;
}

struct TileCase {
  NamedSpec named;
  KvCase kv;
  int page_size;
};

std::string CaseLabel(const TileCase& c) {
  return c.named.name + "_kv" + c.kv.name + "_page" + std::to_string(c.page_size);
}
std::string CaseName(const ::testing::TestParamInfo<TileCase>& info) {
  return CaseLabel(info.param);
}
void PrintTo(const TileCase& c, std::ostream* os) { *os << CaseLabel(c); }

std::vector<TileCase> Cases() {
  std::vector<TileCase> cases;
  for (const NamedSpec& named : TileSpecs()) {
    const bool mla = named.spec.variant == AttentionVariant::kMLA;
    for (const KvCase& kv : KvCases()) {
      if (mla && kv.storage.quantized()) continue;  // MLA's 8-bit pages: kv_quantization_test.
      cases.push_back({named, kv, mla ? 64 : 16});
      if (kv.name == "f32" && !mla) cases.push_back({named, kv, 5});
    }
  }
  return cases;
}

class PrefillTileKernelTest : public ::testing::TestWithParam<TileCase> {};

TEST_P(PrefillTileKernelTest, WholeAndChunkedMatchReference) {
  const TileCase& c = GetParam();
  const LayerSpec& spec = c.named.spec;
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  std::mt19937_64 rng(seed);
  const LayerWeights weights = TestWeights(spec, seed);
  KvCacheConfig config;
  config.storage = c.kv.storage;
  config.page_size = c.page_size;
  config.max_pages = 1024;
  absl::StatusOr<TestEngine> engine = MakeEngine(spec, weights, config);
  ASSERT_TRUE(engine.ok()) << engine.status();
  AttentionLayer& layer = *engine->layer;
  const int d = spec.d_model;
  const int64_t first = 173, second = 130, len = first + second;
  const std::vector<double> hidden = RandomHidden(len, d, rng);
  const std::vector<int64_t> positions = IotaPositions(len);
  const std::vector<double> exact = ReferenceAttention(spec, weights, hidden, positions);
  std::vector<double> rounded;
  if (c.kv.bound_rounded > 0.0) {
    rounded = ReferenceAttention(spec, weights, hidden, positions,
                                 {.kv_round = c.kv.storage.element});
  }

  const auto check = [&](const std::vector<double>& actual, const char* how) {
    const double error = RelativeError(actual, exact);
    EXPECT_LE(error, c.kv.bound_exact) << how;
    RecordProperty(std::string("relative_error_") + how, absl::StrFormat("%.3g", error));
    if (!rounded.empty()) {
      const double error_rounded = RelativeError(actual, rounded);
      EXPECT_LE(error_rounded, c.kv.bound_rounded) << how << " against the rounded cache";
      RecordProperty(std::string("relative_error_vs_rounded_") + how,
                     absl::StrFormat("%.3g", error_rounded));
    }
  };

  const SequenceId whole = layer.CreateSequence();
  const PrefillChunk chunk{.sequence = whole, .num_tokens = len};
  absl::StatusOr<Tensor> out = layer.Prefill({&chunk, 1}, ToTensor(hidden, {len, d}, DType::kF32),
                                             {});
  ASSERT_TRUE(out.ok()) << out.status();
  check(ToDoubles(*out), "whole");
  // Without a causal mask a chunk's tokens see keys of later chunks, which chunked prefill cannot
  // give them: only the whole call is comparable.
  if (!spec.causal) return;

  const SequenceId chunked = layer.CreateSequence();
  std::vector<double> actual;
  for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, first}, {first, second}}) {
    const std::vector<double> part(hidden.begin() + begin * d,
                                   hidden.begin() + (begin + count) * d);
    const PrefillChunk piece{.sequence = chunked, .num_tokens = count};
    absl::StatusOr<Tensor> part_out =
        layer.Prefill({&piece, 1}, ToTensor(part, {count, d}, DType::kF32), {});
    ASSERT_TRUE(part_out.ok()) << part_out.status();
    const std::vector<double> rows = ToDoubles(*part_out);
    actual.insert(actual.end(), rows.begin(), rows.end());
  }
  check(actual, "chunked");
}

INSTANTIATE_TEST_SUITE_P(Tiles, PrefillTileKernelTest, ::testing::ValuesIn(Cases()), CaseName);

// ---- PrefillAttention alone.

// Keys and values of one sequence, float32 rows per KV head.
class VectorKvSource : public KvBlockSource {
 public:
  VectorKvSource(int64_t length, int kv_heads, int key_dim, int value_dim, std::mt19937_64& rng)
      : kv_heads_(kv_heads), key_dim_(key_dim), value_dim_(value_dim),
        keys_(length * kv_heads * key_dim), values_(length * kv_heads * value_dim) {
    std::normal_distribution<float> normal;
    for (float& x : keys_) x = normal(rng);
    for (float& x : values_) x = normal(rng);
  }
  void Fill(int kv_head, int64_t begin, int64_t end, float* keys, float* values) const override {
    for (int64_t i = begin; i < end; ++i) {
      std::copy_n(Key(i, kv_head), key_dim_, keys + (i - begin) * key_dim_);
      std::copy_n(Value(i, kv_head), value_dim_, values + (i - begin) * value_dim_);
    }
  }
  const float* Key(int64_t i, int h) const { return &keys_[(i * kv_heads_ + h) * key_dim_]; }
  const float* Value(int64_t i, int h) const { return &values_[(i * kv_heads_ + h) * value_dim_]; }

 private:
  int kv_heads_, key_dim_, value_dim_;
  std::vector<float> keys_, values_;
};

struct KernelCase {
  std::string name;
  int kv_heads, group, key_dim, value_dim;
  bool causal = true;
  int64_t window = 0;
  float softcap = 0.0f;
  bool sinks = false;
  int alibi = 0;  // AlibiBias::kind.
};

void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.name; }

// Output of query (sequence index `query`, head h) in float64, from the definitions: logits
// scale q.k, soft-capped cap tanh(s / cap), plus slope_h (key - query); the sink's logit joins
// the softmax denominator only.
std::vector<double> ReferenceRow(const KernelCase& c, const AttentionVariation& v,
                                 const float* q, const VectorKvSource& kv, int64_t query,
                                 int64_t length, int h, const float* sinks) {
  const KeyRange keys = v.mask.VisibleKeys(query, length);
  const int kv_head = h / c.group;
  std::vector<double> logits;
  for (int64_t k = keys.begin; k < keys.end; ++k) {
    double dot = 0.0;
    for (int d = 0; d < c.key_dim; ++d) dot += double{q[d]} * kv.Key(k, kv_head)[d];
    double s = double{v.scale} * dot;
    if (c.softcap > 0.0f) s = c.softcap * std::tanh(s / c.softcap);
    if (c.alibi != 0) s += double{v.alibi.Slope(h)} * static_cast<double>(k - query);
    logits.push_back(s);
  }
  double max = c.sinks ? double{sinks[h]} : -INFINITY;
  for (double s : logits) max = std::max(max, s);
  double sum = c.sinks ? std::exp(sinks[h] - max) : 0.0;
  std::vector<double> out(c.value_dim, 0.0);
  for (int64_t k = keys.begin; k < keys.end; ++k) {
    const double w = std::exp(logits[k - keys.begin] - max);
    sum += w;
    for (int d = 0; d < c.value_dim; ++d) out[d] += w * kv.Value(k, kv_head)[d];
  }
  for (double& x : out) x = sum > 0.0 ? x / sum : 0.0;
  return out;
}

class PrefillAttentionKernelTest : public ::testing::TestWithParam<KernelCase> {};

// Three sequences in one call: 300 new tokens from index 0, 150 new tokens after a cached prefix
// of 77 (so query tiles and key panels do not start on a multiple of 16), and 300 after a prefix of
// 1030, so causal query tiles also see two 512-key blocks whole (the one-call softmax of
// OnlineSoftmaxRows, the second rescaling what the first summed) before the diagonal.
TEST_P(PrefillAttentionKernelTest, MatchesFloat64) {
  const KernelCase& c = GetParam();
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  std::mt19937_64 rng(seed);
  const int heads = c.kv_heads * c.group;
  std::vector<float> sinks(heads);
  std::uniform_real_distribution<float> sink_logit(-1.0f, 3.0f);
  for (float& x : sinks) x = sink_logit(rng);

  AttentionVariation v;
  v.scale = 1.0f / std::sqrt(static_cast<float>(c.key_dim));
  v.mask = {c.causal, c.window};
  v.softcap.cap = c.softcap;
  v.alibi = {c.alibi, heads, 8.0f};
  v.sinks.logits = c.sinks ? sinks.data() : nullptr;

  struct Seq {
    int64_t first_index, num_new;
  };
  const Seq seqs[] = {{0, 300}, {77, 150}, {1030, 300}};
  std::vector<VectorKvSource> sources;
  std::vector<PrefillSequence> sequences;
  int64_t rows = 0;
  for (const Seq& s : seqs) {
    sources.emplace_back(s.first_index + s.num_new, c.kv_heads, c.key_dim, c.value_dim, rng);
  }
  for (size_t i = 0; i < std::size(seqs); ++i) {
    sequences.push_back({rows, seqs[i].num_new, seqs[i].first_index,
                         seqs[i].first_index + seqs[i].num_new, &sources[i]});
    rows += seqs[i].num_new;
  }
  std::vector<float> q(rows * heads * c.key_dim);
  std::normal_distribution<float> normal(0.0f, 2.0f);  // Scores of a few units: a peaked softmax.
  for (float& x : q) x = normal(rng);
  std::vector<float> out(rows * heads * c.value_dim, NAN);

  PrefillAttentionParams p;
  p.q = q.data();
  p.q_row_stride = int64_t{heads} * c.key_dim;
  p.out = out.data();
  p.out_row_stride = int64_t{heads} * c.value_dim;
  p.num_kv_heads = c.kv_heads;
  p.group_size = c.group;
  p.key_dim = c.key_dim;
  p.value_dim = c.value_dim;
  p.variation = v;
  ThreadPool pool(2);
  PrefillAttention(p, sequences, pool);
  // The same with keys and values filled per key block (the path of very long cached prefixes).
  std::vector<float> out_per_block(out.size(), NAN);
  p.out = out_per_block.data();
  p.max_gathered_floats = 0;
  PrefillAttention(p, sequences, pool);

  std::vector<double> actual, actual_per_block, expected;
  for (size_t i = 0; i < std::size(seqs); ++i) {
    for (int64_t t = 0; t < seqs[i].num_new; ++t) {
      const int64_t row = sequences[i].first_row + t;
      for (int h = 0; h < heads; ++h) {
        const std::vector<double> exact =
            ReferenceRow(c, v, &q[row * p.q_row_stride + h * c.key_dim], sources[i],
                         seqs[i].first_index + t, sequences[i].length, h, sinks.data());
        expected.insert(expected.end(), exact.begin(), exact.end());
        const float* got = &out[row * p.out_row_stride + h * c.value_dim];
        actual.insert(actual.end(), got, got + c.value_dim);
        const float* got_per_block = &out_per_block[row * p.out_row_stride + h * c.value_dim];
        actual_per_block.insert(actual_per_block.end(), got_per_block, got_per_block + c.value_dim);
      }
    }
  }
  const double error = RelativeError(actual, expected);
  RecordProperty("relative_error", absl::StrFormat("%.3g", error));
  EXPECT_LE(error, 2e-5) << "max-norm relative error " << MaxRelativeError(actual, expected);
  const double error_per_block = RelativeError(actual_per_block, expected);
  RecordProperty("relative_error_per_block", absl::StrFormat("%.3g", error_per_block));
  EXPECT_LE(error_per_block, 2e-5) << "keys and values filled per key block";
}

INSTANTIATE_TEST_SUITE_P(
    Variations, PrefillAttentionKernelTest,
    ::testing::Values(KernelCase{"mha_d64", 2, 1, 64, 64},
                      KernelCase{"gqa4_d64_softcap_sinks", 2, 4, 64, 64, true, 0, 2.0f, true},
                      KernelCase{"mqa8_d32_alibi_window150", 1, 8, 32, 32, true, 150, 0.0f,
                                 false, 1},
                      KernelCase{"gqa2_d80_window40_mpt", 2, 2, 80, 80, true, 40, 0.0f, false, 2},
                      KernelCase{"mha_d48_v32_noncausal_sinks", 2, 1, 48, 32, false, 0, 0.0f,
                                 true},
                      KernelCase{"gqa3_d24_portable_only", 1, 3, 24, 24, true, 0, 5.0f, true}),
    [](const ::testing::TestParamInfo<KernelCase>& info) { return info.param.name; });

}  // namespace
}  // namespace attnserve::reference

// 8-bit KV pages (fp8 e4m3, int8; per-page, per-head scales kept in the page) in the CPU engine,
// every variant: a prompt prefilled in two chunks, then decode steps, at lengths that cross page
// edges (16-token pages; MLA 64) and odd lengths, against the independent float64 reference
// (tests/reference) and against the same engine with a bf16 KV cache. Also: the bytes a quantized
// sequence holds are its pages' bytes, scales included (kernels/kv/quantization.h KvPageBytes).
//
// Tolerances, relative L2 over all outputs of a case (prefill rows and decode rows), against the
// float64 reference (hidden ~ N(0, 4), nn.Linear weights, head dims 8 to 24, 16-token pages):
//   int8: a cached value moves by at most one step of its page's final scale, a power of two
//         below 2 absmax / 127, i.e. by <= 1.6e-2 of its group's absmax (about 1e-2 of a typical
//         value, RMS); through the scores and the value average the output moved by 1.5e-2 to
//         2.4e-2 (worst of 5 seeds x 5 lengths per spec, docs/kv_quantization.md). Bound 5e-2.
//   fp8:  3 mantissa bits, relative rounding error <= 2^-4 = 6.3e-2 per value (about 3e-2 RMS);
//         measured 3.6e-2 to 5.0e-2. Bound 1e-1.
//   (bf16 KV, for scale: 2.4e-3 to 3.0e-3.)
// Both bounds are about twice the worst measured; a defect (a wrong or stale scale, a lost
// requantization, a head or segment reading another's scale) reads values off by a factor of 2 or
// more and moves the output by far more than that.
#include "kernels/kv/quantization.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/reference/attention_reference.h"
#include "tests/reference/test_cases.h"

namespace attnserve::reference {
namespace {

constexpr double kInt8Bound = 5e-2;
constexpr double kFp8Bound = 1e-1;

// Causal catalogue specs (decode continues a causal sequence): MHA, MQA, GQA with group sizes 2
// and 4 over several KV heads, sliding windows, MLA with and without q_lora, windowed MLA.
const char* const kSpecs[] = {
    "mha_half_bias",
    "mha_interleaved_hd24",
    "mqa_half",
    "gqa2_half_bias_hd16_theta5e5",
    "gqa4_interleaved_obias",
    "gqa3_half_hd10_d48",
    "gqa2_half_window7",
    "mqa_half_window33",
    "mla_q0_interleaved",
    "mla_q24_half",
    "mla_q0_interleaved_window9",
};

// Prompt lengths: one token, odd lengths across one and several 16-token pages, an MLA page edge,
// and 300, whose chunks (150 tokens each, x 4 KV heads in the MHA specs) take the layer's parallel
// KV append (CpuLayer::StoreKvRows, from 512 row-heads), the second split at token 256.
constexpr int64_t kPrompts[] = {1, 17, 37, 63, 100, 300};
constexpr int kDecodeSteps = 9;

struct Errors {
  double relative_l2 = 0;  // ||actual - expected|| / ||expected||
  double max_abs = 0;      // max |actual - expected|
};

Errors Compare(const std::vector<double>& actual, const std::vector<double>& expected) {
  Errors e{RelativeError(actual, expected), 0.0};
  for (size_t i = 0; i < actual.size(); ++i) {
    e.max_abs = std::max(e.max_abs, std::fabs(actual[i] - expected[i]));
  }
  return e;
}

// The outputs of every token of one sequence [prompt + steps, d_model]: the prompt prefilled in
// two chunks (first half, then the rest), then one decode step per remaining token.
absl::StatusOr<std::vector<double>> RunEngine(const LayerSpec& spec, const LayerWeights& weights,
                                              KvStorageFormat storage,
                                              const std::vector<double>& hidden, int64_t prompt,
                                              int64_t* kv_bytes = nullptr) {
  KvCacheConfig config;
  config.storage = storage;
  config.max_pages = 256;
  absl::StatusOr<TestEngine> engine = MakeEngine(spec, weights, config);
  if (!engine.ok()) return engine.status();
  AttentionLayer& layer = *engine->layer;
  const int d = spec.d_model;
  const int64_t total = static_cast<int64_t>(hidden.size()) / d;
  const SequenceId sequence = layer.CreateSequence();
  std::vector<double> outputs;
  const int64_t first_chunk = std::max<int64_t>(1, prompt / 2);
  for (auto [begin, end] : {std::pair{int64_t{0}, first_chunk}, std::pair{first_chunk, prompt}}) {
    if (end <= begin) continue;
    const PrefillChunk chunk{.sequence = sequence, .num_tokens = end - begin};
    absl::StatusOr<Tensor> out = layer.Prefill(
        {&chunk, 1}, ToTensor(SliceRows(hidden, d, begin, end), {end - begin, d}, DType::kF32), {});
    if (!out.ok()) return out.status();
    const std::vector<double> rows = ToDoubles(*out);
    outputs.insert(outputs.end(), rows.begin(), rows.end());
  }
  for (int64_t t = prompt; t < total; ++t) {
    absl::StatusOr<Tensor> out = layer.Decode(
        {&sequence, 1}, ToTensor(SliceRows(hidden, d, t, t + 1), {1, d}, DType::kF32), {});
    if (!out.ok()) return out.status();
    const std::vector<double> row = ToDoubles(*out);
    outputs.insert(outputs.end(), row.begin(), row.end());
  }
  if (kv_bytes != nullptr) *kv_bytes = layer.SequenceKvBytes(sequence).value_or(-1);
  return outputs;
}

struct CaseErrors {
  Errors vs_exact;  // Against the float64 reference.
  Errors vs_bf16;   // Against the engine with a bf16 KV cache.
};

// Worst errors of one spec and format over every prompt length, for one seed.
CaseErrors MeasureSpec(const LayerSpec& spec, KvStorageFormat storage, uint64_t seed) {
  const LayerWeights weights = TestWeights(spec, seed);
  std::mt19937_64 rng(seed);
  CaseErrors worst;
  for (int64_t prompt : kPrompts) {
    SCOPED_TRACE(absl::StrCat("prompt ", prompt));
    const int64_t total = prompt + kDecodeSteps;
    const std::vector<double> hidden = RandomHidden(total, spec.d_model, rng);
    int64_t kv_bytes = 0;
    absl::StatusOr<std::vector<double>> actual =
        RunEngine(spec, weights, storage, hidden, prompt, &kv_bytes);
    absl::StatusOr<std::vector<double>> bf16 =
        RunEngine(spec, weights, DType::kBF16, hidden, prompt);
    EXPECT_TRUE(actual.ok() && bf16.ok()) << actual.status() << bf16.status();
    if (!actual.ok() || !bf16.ok()) return {{1e9, 1e9}, {1e9, 1e9}};
    const std::vector<double> exact =
        ReferenceAttention(spec, weights, hidden, IotaPositions(total));
    const Errors vs_exact = Compare(*actual, exact), vs_bf16 = Compare(*actual, *bf16);
    worst.vs_exact.relative_l2 = std::max(worst.vs_exact.relative_l2, vs_exact.relative_l2);
    worst.vs_exact.max_abs = std::max(worst.vs_exact.max_abs, vs_exact.max_abs);
    worst.vs_bf16.relative_l2 = std::max(worst.vs_bf16.relative_l2, vs_bf16.relative_l2);
    worst.vs_bf16.max_abs = std::max(worst.vs_bf16.max_abs, vs_bf16.max_abs);

    // The sequence holds whole pages (a window evicts old ones): bytes are pages times the page
    // bytes of the format, its scales included.
    const int page_size = DefaultPageSize(spec);
    const int64_t page_bytes = KvPageBytes(spec, storage, page_size);
    EXPECT_GT(kv_bytes, 0);
    EXPECT_EQ(kv_bytes % page_bytes, 0) << kv_bytes << " bytes in pages of " << page_bytes;
    EXPECT_LE(kv_bytes, (total + page_size - 1) / page_size * page_bytes);
  }
  return worst;
}

struct QuantCase {
  std::string spec_name;
  KvQuantization quantization;
};

void PrintTo(const QuantCase& c, std::ostream* os) {
  *os << c.spec_name << " " << KvQuantizationName(c.quantization);
}

class KvQuantizationTest : public ::testing::TestWithParam<QuantCase> {};

TEST_P(KvQuantizationTest, PrefillThenDecodeWithinTheFormatsBound) {
  const QuantCase& c = GetParam();
  const LayerSpec spec = FindSpec(c.spec_name).spec;
  ASSERT_GT(spec.d_model, 0) << c.spec_name;
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  const CaseErrors e = MeasureSpec(spec, KvStorageFormat::Quantized(c.quantization), seed);
  const double bound = c.quantization == KvQuantization::kInt8 ? kInt8Bound : kFp8Bound;
  EXPECT_LE(e.vs_exact.relative_l2, bound)
      << "max abs " << e.vs_exact.max_abs << "; against bf16 KV " << e.vs_bf16.relative_l2;
  // bf16 KV is itself within 1.6e-2 of the reference (reference_test), so the two meet within
  // the sum of their bounds.
  EXPECT_LE(e.vs_bf16.relative_l2, bound + 1.6e-2);
  RecordProperty("relative_l2_vs_f64", absl::StrFormat("%.3g", e.vs_exact.relative_l2));
  RecordProperty("max_abs_vs_f64", absl::StrFormat("%.3g", e.vs_exact.max_abs));
  RecordProperty("relative_l2_vs_bf16_kv", absl::StrFormat("%.3g", e.vs_bf16.relative_l2));
}

std::vector<QuantCase> Cases() {
  std::vector<QuantCase> cases;
  for (const char* name : kSpecs) {
    for (KvQuantization q : {KvQuantization::kFp8E4M3, KvQuantization::kInt8}) {
      cases.push_back({name, q});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Variants, KvQuantizationTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<QuantCase>& info) {
                           return absl::StrCat(info.param.spec_name, "_",
                                               KvQuantizationName(info.param.quantization));
                         });

// The table of docs/kv_quantization.md: worst errors over seeds 1..5 per spec and KV format
// (bf16 included, for scale). Prints markdown rows; checks nothing beyond the tests above.
//   build/release/tests/engine/kv_quantization_test --gtest_also_run_disabled_tests
//     --gtest_filter='KvQuantizationTable.*'
TEST(KvQuantizationTable, DISABLED_PrintErrorTable) {
  std::printf(
      "| spec | KV | rel. L2 vs f64 | max abs vs f64 | rel. L2 vs bf16 KV | page bytes | "
      "bytes/token |\n| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const char* name : kSpecs) {
    const LayerSpec spec = FindSpec(name).spec;
    for (KvStorageFormat storage :
         {KvStorageFormat(DType::kBF16), KvStorageFormat::Quantized(KvQuantization::kFp8E4M3),
          KvStorageFormat::Quantized(KvQuantization::kInt8)}) {
      CaseErrors worst;
      for (uint64_t seed = 1; seed <= 5; ++seed) {
        const CaseErrors e = MeasureSpec(spec, storage, seed);
        worst.vs_exact.relative_l2 = std::max(worst.vs_exact.relative_l2, e.vs_exact.relative_l2);
        worst.vs_exact.max_abs = std::max(worst.vs_exact.max_abs, e.vs_exact.max_abs);
        worst.vs_bf16.relative_l2 = std::max(worst.vs_bf16.relative_l2, e.vs_bf16.relative_l2);
      }
      const int page_size = DefaultPageSize(spec);
      const std::string vs_bf16 =
          storage.quantized() ? absl::StrFormat("%.2e", worst.vs_bf16.relative_l2) : "-";
      std::printf("| %s | %s | %.2e | %.2e | %s | %lld | %lld |\n", name,
                  KvStorageFormatName(storage).c_str(), worst.vs_exact.relative_l2,
                  worst.vs_exact.max_abs, vs_bf16.c_str(),
                  static_cast<long long>(KvPageBytes(spec, storage, page_size)),
                  static_cast<long long>(KvBytesPerTokenOf(spec, storage, page_size)));
    }
  }
}

}  // namespace
}  // namespace attnserve::reference

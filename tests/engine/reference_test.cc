// The CPU engine (CreateCpuBackend -> CreateLayer -> CreateSequence -> Prefill) against the
// independent float64 reference, for every variant and option in SpecCatalog(), lengths that
// cross page and tile boundaries, several page sizes, and every KV and hidden dtype.
//
// Tolerances (relative, in the 2-norm over the whole [L, d_model] output):
//   f32 KV, f32 hidden:  1e-4. The engine computes in float32 (unit roundoff 2^-24 = 6e-8); the
//                        dot products are at most a few hundred terms long and softmax is stable,
//                        so 1e-4 leaves ample headroom while catching any semantic mistake (a
//                        wrong mask, RoPE pair or head mapping moves the output by > 1e-2).
//   bf16 KV:             see kBf16KvBound below.
//   f16/bf16 hidden:     the output is returned in hidden's dtype, so it carries one rounding of
//                        relative size <= u per element (u = 2^-11 for f16, 2^-8 for bf16), hence
//                        <= u in the 2-norm; the bound is u + 1e-4 against a reference computed on
//                        the rounded inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/core/tensor.h"
#include "kernels/spec/layer_spec.h"
#include "tests/reference/attention_reference.h"
#include "tests/reference/test_cases.h"

namespace attnserve::reference {
namespace {

constexpr double kF32Bound = 1e-4;

// bf16 has 8 significant bits: unit roundoff u = 2^-8 = 3.9e-3 (rounding to nearest moves a value
// by at most u relative). Caching K and V (MLA: c_kv and k_pe) in bf16 perturbs every cached value
// by <= u. Values enter the output linearly through a convex combination, contributing <= u;
// keys enter through scores s = scale * q.k, perturbed by <= u * scale * sum|q_d k_d|, which moves
// the softmax weights by about that much relative (our scores are O(1-3)).
// Measured over ~800 runs of each bf16 case (every catalogue spec, every length, hidden ~ N(0, 4),
// nn.Linear weights): median 2.5e-3, max 4.0e-3, i.e. about u. The bound is 4u = 1.6e-2: a small
// multiple of u with headroom for unlucky draws, while a real defect (wrong page, stale slot,
// lost RoPE) gives errors of order 1e-1.
constexpr double kBf16Unit = 1.0 / 256.0;
constexpr double kBf16KvBound = 4 * kBf16Unit;
// Against a reference that rounds the cached values to bf16 too (keys after RoPE, MLA latent after
// its RMSNorm), only float32 compute differs, plus rare elements where the engine's float32 value
// and the float64 one round to neighbouring bf16 values (a 2u change in one element). Measured
// over the same runs: median 1e-5, 99th percentile 3.7e-4, max 8.2e-4. The bound 2e-3 (about
// u/2) still tells "rounds the post-RoPE, post-norm value to nearest" apart from other storage
// choices, which show up at ~u.
constexpr double kBf16KvVsRoundedBound = 2e-3;

constexpr int64_t kLengths[] = {1, 15, 16, 17, 63, 64, 65, 100, 257};

struct PrefillCase {
  NamedSpec named;
  int page_size = 16;
  DType kv_dtype = DType::kF32;
  DType hidden_dtype = DType::kF32;
};

std::string CaseLabel(const PrefillCase& c) {
  return c.named.name + "_page" + std::to_string(c.page_size) + "_kv" +
         std::string(DTypeName(c.kv_dtype)) + "_hidden" + std::string(DTypeName(c.hidden_dtype));
}
std::string CaseName(const ::testing::TestParamInfo<PrefillCase>& info) {
  return CaseLabel(info.param);
}
// Keeps ctest's "GetParam() = ..." readable instead of a byte dump.
void PrintTo(const PrefillCase& c, std::ostream* os) { *os << CaseLabel(c); }

double UnitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 0.0;  // Already covered by kF32Bound.
    case DType::kF16:
      return 1.0 / 2048.0;
    case DType::kBF16:
      return kBf16Unit;
  }
  return 0.0;
}

class PrefillVsReferenceTest : public ::testing::TestWithParam<PrefillCase> {};

// One sequence per length, all in the same layer, each prefilled in one call; half of them with
// explicit RoPE positions that do not start at 0 (masks must follow the index, not the position).
TEST_P(PrefillVsReferenceTest, MatchesReference) {
  const PrefillCase& c = GetParam();
  const LayerSpec& spec = c.named.spec;
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  const LayerWeights weights = TestWeights(spec, seed);
  absl::StatusOr<TestEngine> engine =
      MakeEngine(spec, weights, {.storage = c.kv_dtype, .page_size = c.page_size, .max_pages = 1024});
  ASSERT_TRUE(engine.ok()) << engine.status();
  AttentionLayer& layer = *engine->layer;
  std::mt19937_64 rng(seed);
  const int d = spec.d_model;

  double worst = 0.0;  // Recorded in the test's XML/JSON properties, to keep the bounds honest.
  double worst_vs_rounded = 0.0;
  for (int64_t len : kLengths) {
    SCOPED_TRACE("length " + std::to_string(len));
    const bool explicit_positions = len % 2 == 1;
    const std::vector<int64_t> positions = IotaPositions(len, explicit_positions ? 37 : 0);
    // What the engine sees of the input after conversion to hidden's dtype.
    const std::vector<double> hidden = RoundTo(RandomHidden(len, d, rng), c.hidden_dtype);

    const SequenceId sequence = layer.CreateSequence();
    const PrefillChunk chunk{.sequence = sequence, .num_tokens = len};
    absl::StatusOr<Tensor> out = layer.Prefill(
        {&chunk, 1}, ToTensor(hidden, {len, d}, c.hidden_dtype),
        explicit_positions ? absl::Span<const int64_t>(positions) : absl::Span<const int64_t>());
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->shape(), (std::vector<int64_t>{len, d}));
    EXPECT_EQ(out->dtype(), c.hidden_dtype);
    EXPECT_EQ(layer.SequenceLength(sequence).value_or(-1), len);
    const std::vector<double> actual = ToDoubles(*out);

    const std::vector<double> exact = ReferenceAttention(spec, weights, hidden, positions);
    const double error = RelativeError(actual, exact);
    worst = std::max(worst, error);
    if (c.kv_dtype == DType::kF32) {
      EXPECT_LE(error, kF32Bound + UnitRoundoff(c.hidden_dtype))
          << "max-norm relative error " << MaxRelativeError(actual, exact);
    } else {
      EXPECT_LE(error, kBf16KvBound + UnitRoundoff(c.hidden_dtype));
      const std::vector<double> rounded =
          ReferenceAttention(spec, weights, hidden, positions, {.kv_round = c.kv_dtype});
      const double error_vs_rounded = RelativeError(actual, rounded);
      worst_vs_rounded = std::max(worst_vs_rounded, error_vs_rounded);
      EXPECT_LE(error_vs_rounded, kBf16KvVsRoundedBound + UnitRoundoff(c.hidden_dtype))
          << "error against the exact reference: " << error;
    }
    if (::testing::Test::HasFailure()) break;  // One length's report is enough.
  }
  RecordProperty("worst_relative_error", absl::StrFormat("%.3g", worst));
  if (c.kv_dtype != DType::kF32) {
    RecordProperty("worst_relative_error_vs_rounded_kv", absl::StrFormat("%.3g", worst_vs_rounded));
  }
}

std::vector<PrefillCase> F32Cases() {
  std::vector<PrefillCase> cases;
  for (const NamedSpec& named : SpecCatalog()) {
    for (int page_size : {5, 16, 64}) cases.push_back({named, page_size});
  }
  return cases;
}

std::vector<PrefillCase> Bf16KvCases() {
  std::vector<PrefillCase> cases;
  for (const NamedSpec& named : SpecCatalog()) {
    cases.push_back({named, named.spec.variant == AttentionVariant::kMLA ? 64 : 16, DType::kBF16});
  }
  return cases;
}

std::vector<PrefillCase> HiddenDtypeCases() {
  std::vector<PrefillCase> cases;
  for (const NamedSpec& named : SpecCatalog()) {
    for (DType hidden : {DType::kF16, DType::kBF16}) {
      cases.push_back({named, 16, DType::kF32, hidden});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(KvF32, PrefillVsReferenceTest, ::testing::ValuesIn(F32Cases()), CaseName);
INSTANTIATE_TEST_SUITE_P(KvBf16, PrefillVsReferenceTest, ::testing::ValuesIn(Bf16KvCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(HiddenHalf, PrefillVsReferenceTest,
                         ::testing::ValuesIn(HiddenDtypeCases()), CaseName);

// Weights may arrive in any dtype (checkpoints are often bf16); the engine must use the values
// they hold, which is what the reference reads.
TEST(PrefillWeightsTest, Bf16AndF16WeightsMatchReference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  std::mt19937_64 rng(seed);
  for (const char* name : {"gqa2_half_bias_hd16_theta5e5", "mla_q24_half"}) {
    for (DType weight_dtype : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string(name) + " weights " + std::string(DTypeName(weight_dtype)));
      const LayerSpec spec = FindSpec(name).spec;
      LayerWeights weights = TestWeights(spec, seed);
      for (auto& [unused, tensor] : weights) tensor = tensor.CastTo(weight_dtype);
      absl::StatusOr<TestEngine> engine = MakeEngine(spec, weights, {});
      ASSERT_TRUE(engine.ok()) << engine.status();
      const int64_t len = 40;
      const std::vector<double> hidden = RandomHidden(len, spec.d_model, rng);
      const SequenceId sequence = engine->layer->CreateSequence();
      const PrefillChunk chunk{.sequence = sequence, .num_tokens = len};
      absl::StatusOr<Tensor> out = engine->layer->Prefill(
          {&chunk, 1}, ToTensor(hidden, {len, spec.d_model}, DType::kF32), {});
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_LE(RelativeError(ToDoubles(*out),
                              ReferenceAttention(spec, weights, hidden, IotaPositions(len))),
                kF32Bound);
    }
  }
}

// CpuBackendOptions::projection_weights = bf16: q/k/v/o_proj's weights are rounded to bf16 once
// and every product is computed from them widened to f32, with f32 accumulation. Against the
// reference on the rounded weights the layer must be as close as with f32 weights (kF32Bound):
// widening is exact, so any larger error is a kernel defect. Against the weights as given the
// rounding shows: each of the four projections on the path moves its output by about u
// relative; the bound is kBf16KvBound's 4u (measured: 2.5e-3 to 3.5e-3, about u; against the
// rounded weights 2.3e-7 to 2.9e-7).
// Prefill (20 rows: the sgemm path over widened blocks) then decode steps of 3 rows at once (the
// GEMV path), three sequences with their own prompts; d_model 48 with head_dim 10 leaves a tail
// after the kernels' 8-wide vectors in o_proj (30 inputs).
TEST(Bf16ProjectionWeightsTest, PrefillAndDecodeMatchReference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  std::mt19937_64 rng(seed);
  for (const char* name : {"gqa2_half_bias_hd16_theta5e5", "gqa3_half_hd10_d48", "mha_half_bias"}) {
    SCOPED_TRACE(name);
    const LayerSpec spec = FindSpec(name).spec;
    const LayerWeights weights = TestWeights(spec, seed);
    LayerWeights rounded = weights;
    for (const char* w : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}) {
      rounded.at(w) = weights.at(w).CastTo(DType::kBF16);
    }
    absl::StatusOr<TestEngine> engine = MakeEngine(
        spec, weights, {.max_pages = 1024}, {.num_threads = 2, .projection_weights = DType::kBF16});
    ASSERT_TRUE(engine.ok()) << engine.status();
    constexpr int kSequences = 3, kPrompt = 20, kSteps = 4, kLength = kPrompt + kSteps;
    std::vector<std::vector<double>> hidden(kSequences), out(kSequences);
    std::vector<SequenceId> ids;
    for (int b = 0; b < kSequences; ++b) {
      hidden[b] = RandomHidden(kLength, spec.d_model, rng);
      ids.push_back(engine->layer->CreateSequence());
      const PrefillChunk chunk{.sequence = ids.back(), .num_tokens = kPrompt};
      const std::vector<double> prompt(hidden[b].begin(),
                                       hidden[b].begin() + kPrompt * spec.d_model);
      absl::StatusOr<Tensor> y = engine->layer->Prefill(
          {&chunk, 1}, ToTensor(prompt, {kPrompt, spec.d_model}, DType::kF32), {});
      ASSERT_TRUE(y.ok()) << y.status();
      out[b] = ToDoubles(*y);
    }
    for (int t = kPrompt; t < kLength; ++t) {
      std::vector<double> step;
      for (int b = 0; b < kSequences; ++b) {
        step.insert(step.end(), hidden[b].begin() + t * spec.d_model,
                    hidden[b].begin() + (t + 1) * spec.d_model);
      }
      absl::StatusOr<Tensor> y =
          engine->layer->Decode(ids, ToTensor(step, {kSequences, spec.d_model}, DType::kF32), {});
      ASSERT_TRUE(y.ok()) << y.status();
      const std::vector<double> rows = ToDoubles(*y);
      for (int b = 0; b < kSequences; ++b) {
        out[b].insert(out[b].end(), rows.begin() + b * spec.d_model,
                      rows.begin() + (b + 1) * spec.d_model);
      }
    }
    for (int b = 0; b < kSequences; ++b) {
      const double vs_rounded = RelativeError(
          out[b], ReferenceAttention(spec, rounded, hidden[b], IotaPositions(kLength)));
      const double vs_given = RelativeError(
          out[b], ReferenceAttention(spec, weights, hidden[b], IotaPositions(kLength)));
      EXPECT_LE(vs_rounded, kF32Bound) << "sequence " << b;
      EXPECT_LE(vs_given, kBf16KvBound) << "sequence " << b;
      EXPECT_GT(vs_given, vs_rounded) << "sequence " << b << ": were the weights rounded?";
    }
  }
}

// The option's edges: a dtype the CPU does not keep weights in is refused naming the field, and a
// bf16 layer reports its projection weights at 2 bytes each (the norms, biases and sinks stay f32).
TEST(Bf16ProjectionWeightsTest, OtherDtypesAreRefusedAndParameterBytesHalve) {
  absl::StatusOr<std::unique_ptr<AttentionBackend>> f16 =
      CreateCpuBackend({.num_threads = 1, .projection_weights = DType::kF16});
  ASSERT_EQ(f16.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f16.status().message().find("projection_weights = f16"), absl::string_view::npos)
      << f16.status();
  const LayerSpec spec = FindSpec("gqa2_half_bias_hd16_theta5e5").spec;
  const LayerWeights weights = TestWeights(spec, 1);
  absl::StatusOr<TestEngine> f32 = MakeEngine(spec, weights, {});
  absl::StatusOr<TestEngine> bf16 =
      MakeEngine(spec, weights, {}, {.num_threads = 1, .projection_weights = DType::kBF16});
  ASSERT_TRUE(f32.ok() && bf16.ok());
  int64_t projection_elements = 0;
  for (const char* w : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}) {
    projection_elements += weights.at(w).num_elements();
  }
  EXPECT_EQ(f32->layer->ParameterBytes(), ParameterCount(spec) * 4);
  EXPECT_EQ(bf16->layer->ParameterBytes(), ParameterCount(spec) * 4 - projection_elements * 2);
}

// The prefill kernel works in tiles (64 query rows x 128 keys; keys and values converted once per
// KV head) and skips the mask on key blocks that every row of a tile sees whole. Lengths here
// cross several tiles and key blocks at odd offsets; windows cut tiles in the middle or leave
// whole blocks visible; the second chunk attends to a cached prefix that ends mid-block.
TEST(PrefillTilesTest, WindowsAndChunksAcrossTilesMatchReference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  std::mt19937_64 rng(seed);
  for (const char* name : {"gqa2_half_window7", "mqa_half_window33", "mla_q0_interleaved"}) {
    for (int window : {0, 100, 150}) {
      SCOPED_TRACE(std::string(name) + " window " + std::to_string(window));
      LayerSpec spec = FindSpec(name).spec;
      spec.sliding_window = window;
      const LayerWeights weights = TestWeights(spec, seed);
      absl::StatusOr<TestEngine> engine = MakeEngine(spec, weights, {.max_pages = 1024});
      ASSERT_TRUE(engine.ok()) << engine.status();
      const int d = spec.d_model;
      const int64_t first = 173, second = 130, len = first + second;
      const std::vector<double> hidden = RandomHidden(len, d, rng);
      const std::vector<double> exact =
          ReferenceAttention(spec, weights, hidden, IotaPositions(len));

      // Whole, in one call.
      const SequenceId whole = engine->layer->CreateSequence();
      const PrefillChunk chunk{.sequence = whole, .num_tokens = len};
      absl::StatusOr<Tensor> out =
          engine->layer->Prefill({&chunk, 1}, ToTensor(hidden, {len, d}, DType::kF32), {});
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_LE(RelativeError(ToDoubles(*out), exact), kF32Bound) << "one call";

      // In two chunks: the second over a cached prefix.
      const SequenceId chunked = engine->layer->CreateSequence();
      std::vector<double> actual;
      for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, first}, {first, second}}) {
        const std::vector<double> part(hidden.begin() + begin * d,
                                       hidden.begin() + (begin + count) * d);
        const PrefillChunk piece{.sequence = chunked, .num_tokens = count};
        absl::StatusOr<Tensor> part_out =
            engine->layer->Prefill({&piece, 1}, ToTensor(part, {count, d}, DType::kF32), {});
        ASSERT_TRUE(part_out.ok()) << part_out.status();
        const std::vector<double> rows = ToDoubles(*part_out);
        actual.insert(actual.end(), rows.begin(), rows.end());
      }
      EXPECT_LE(RelativeError(actual, exact), kF32Bound) << "two chunks";
    }
  }
}

// A prefill of 256 rows or more runs its per-row work in 64-row runs over the pool (GQA: the q/k
// norm and RoPE; MLA: the latent norms, RoPE and the read-back of the cached latents) and stores
// 512 rows or more in page runs over the pool; fewer rows take the calling thread's loops. Both
// must give the same layer: the same 600 tokens in one call (nine runs, a partial last) and in
// three 200-row chunks (the second and third over a cached prefix), for each q/k norm kind with
// RoPE and for MLA with and without a q LoRA (a row normalised twice, rotated twice or left out
// would move its output far past the bound; the reference has no q/k norm to compare with).
TEST(PrefillRowRunsTest, OneCallMatchesChunks) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::pair<std::string, LayerSpec>> specs;
  for (const QkNorm norm : {QkNorm::kRms, QkNorm::kRmsUnitOffset, QkNorm::kRmsAcrossHeads,
                            QkNorm::kLayerNorm}) {
    LayerSpec spec = FindSpec("gqa2_half_bias_hd16_theta5e5").spec;
    spec.qk_norm = norm;
    spec.qk_norm_eps = 1e-5f;
    specs.emplace_back(std::string(QkNormName(norm)), spec);
  }
  for (const char* name : {"mla_q0_interleaved", "mla_q24_half"}) {
    specs.emplace_back(name, FindSpec(name).spec);
  }
  for (const auto& [name, spec] : specs) {
    SCOPED_TRACE(name);
    const LayerWeights weights = TestWeights(spec, seed);
    absl::StatusOr<TestEngine> engine = MakeEngine(spec, weights, {.max_pages = 1024});
    ASSERT_TRUE(engine.ok()) << engine.status();
    const int d = spec.d_model;
    constexpr int64_t kLength = 600, kChunk = 200;
    const std::vector<double> hidden = RandomHidden(kLength, d, rng);

    const SequenceId whole = engine->layer->CreateSequence();
    const PrefillChunk chunk{.sequence = whole, .num_tokens = kLength};
    absl::StatusOr<Tensor> out =
        engine->layer->Prefill({&chunk, 1}, ToTensor(hidden, {kLength, d}, DType::kF32), {});
    ASSERT_TRUE(out.ok()) << out.status();

    const SequenceId chunked = engine->layer->CreateSequence();
    std::vector<double> actual;
    for (int64_t begin = 0; begin < kLength; begin += kChunk) {
      const std::vector<double> part(hidden.begin() + begin * d,
                                     hidden.begin() + (begin + kChunk) * d);
      const PrefillChunk piece{.sequence = chunked, .num_tokens = kChunk};
      absl::StatusOr<Tensor> part_out =
          engine->layer->Prefill({&piece, 1}, ToTensor(part, {kChunk, d}, DType::kF32), {});
      ASSERT_TRUE(part_out.ok()) << part_out.status();
      const std::vector<double> rows = ToDoubles(*part_out);
      actual.insert(actual.end(), rows.begin(), rows.end());
    }
    EXPECT_LE(RelativeError(ToDoubles(*out), actual), kF32Bound);
  }
}

}  // namespace
}  // namespace attnserve::reference

// Prefix sharing (AttentionLayer::ForkSequence, kernels/kv/sequence_table.h): forks of a prefilled
// sequence decode bit for bit as independent copies prefilled with the same prompt, while the pool
// holds the prompt's full pages once (plus one copied partial page per fork); releasing the source
// or any fork leaves the others intact, and the last holder returns every page. 8-bit pages
// (fp8/int8 with per-page scales in the page's bytes) fork the same way: the copied partial page
// carries its scales, and later rows rescale the fork's copy exactly as they rescale a copy's.
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kv/sequence_table.h"
#include "tests/reference/attention_reference.h"
#include "tests/reference/test_cases.h"

namespace attnserve::reference {
namespace {

using ::testing::HasSubstr;

struct ForkCase {
  std::string name;
  LayerSpec spec;
  int64_t prompt = 37;  // Tokens; 37 = two full pages of 16 and a partial third.
  KvStorageFormat storage = DType::kF32;
};

std::vector<ForkCase> Cases() {
  std::vector<ForkCase> cases;
  cases.push_back({"gqa", StandardSpec(8, 2, 16, RopeLayout::kHalf)});
  cases.push_back({"mha_full_pages", StandardSpec(4, 4, 16, RopeLayout::kHalf), 32});
  LayerSpec window = StandardSpec(4, 4, 16, RopeLayout::kHalf);
  window.sliding_window = 20;  // Evicts the shared first page while the forks decode.
  cases.push_back({"mha_window", window});
  cases.push_back({"mla", MlaSpec(0, 32, 16, 8, 16, RopeLayout::kInterleaved)});
  const KvStorageFormat fp8 = KvStorageFormat::Quantized(KvQuantization::kFp8E4M3);
  const KvStorageFormat int8 = KvStorageFormat::Quantized(KvQuantization::kInt8);
  cases.push_back({"gqa_fp8", StandardSpec(8, 2, 16, RopeLayout::kHalf), 37, fp8});
  cases.push_back({"mha_window_int8", window, 37, int8});
  cases.push_back({"mla_fp8", MlaSpec(0, 32, 16, 8, 16, RopeLayout::kInterleaved), 37, fp8});
  cases.push_back({"mla_int8", MlaSpec(0, 32, 16, 8, 16, RopeLayout::kInterleaved), 21, int8});
  return cases;
}

void PrintTo(const ForkCase& c, std::ostream* os) { *os << c.name; }

// Pages of 16 tokens in `storage` (f32 by default).
KvCacheConfig Pool(int64_t max_pages, KvStorageFormat storage = DType::kF32) {
  KvCacheConfig config;
  config.storage = storage;
  config.page_size = 16;
  config.max_pages = max_pages;
  return config;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.num_bytes()) == 0;
}

class KvForkTest : public ::testing::TestWithParam<ForkCase> {};

TEST_P(KvForkTest, ForksDecodeAsIndependentCopiesAndShareThePromptPages) {
  const ForkCase& c = GetParam();
  const int d = c.spec.d_model;
  const LayerWeights weights = TestWeights(c.spec, 17);
  ASSERT_FALSE(weights.empty());
  absl::StatusOr<TestEngine> shared = MakeEngine(c.spec, weights, Pool(64, c.storage));
  absl::StatusOr<TestEngine> copies = MakeEngine(c.spec, weights, Pool(64, c.storage));
  ASSERT_TRUE(shared.ok() && copies.ok()) << shared.status() << copies.status();
  AttentionLayer& a = *shared->layer;
  AttentionLayer& b = *copies->layer;
  constexpr int kForks = 3;
  std::mt19937_64 rng(3);
  const Tensor prompt = ToTensor(RandomHidden(c.prompt, d, rng), {c.prompt, d}, DType::kF32);

  // A: one prefill, then forks. B: the prompt prefilled into 1 + kForks sequences of their own.
  const SequenceId source = a.CreateSequence();
  const PrefillChunk chunk{.sequence = source, .num_tokens = c.prompt};
  absl::StatusOr<Tensor> prefill_a = a.Prefill({&chunk, 1}, prompt, {});
  ASSERT_TRUE(prefill_a.ok()) << prefill_a.status();
  const int64_t prompt_pages = a.PoolUsage().used_pages;
  absl::StatusOr<std::vector<SequenceId>> forks = a.ForkSequence(source, kForks);
  ASSERT_TRUE(forks.ok()) << forks.status();
  ASSERT_EQ(forks->size(), size_t{kForks});
  const bool partial = c.prompt % 16 != 0;
  EXPECT_EQ(a.PoolUsage().used_pages, prompt_pages + (partial ? kForks : 0))
      << "full pages are held once; only the partial last page is copied per fork";
  for (SequenceId fork : *forks) {
    EXPECT_EQ(a.SequenceLength(fork).value_or(-1), c.prompt);
    EXPECT_EQ(a.SequenceKvBytes(fork).value_or(-1), a.SequenceKvBytes(source).value_or(-2));
  }
  std::vector<SequenceId> in_a = *forks;
  in_a.push_back(source);
  std::vector<SequenceId> in_b;
  for (int i = 0; i <= kForks; ++i) {
    const PrefillChunk copy{.sequence = b.CreateSequence(), .num_tokens = c.prompt};
    absl::StatusOr<Tensor> prefill_b = b.Prefill({&copy, 1}, prompt, {});
    ASSERT_TRUE(prefill_b.ok()) << prefill_b.status();
    EXPECT_TRUE(SameBits(*prefill_a, *prefill_b));
    in_b.push_back(copy.sequence);
  }
  EXPECT_GT(b.PoolUsage().used_pages, a.PoolUsage().used_pages);

  // Decode all of them together, different inputs per sequence; halfway, the source is released
  // in both (its forks must not lose the pages they share with it).
  for (int step = 0; step < 24; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    if (step == 12) {
      ASSERT_TRUE(a.ReleaseSequence(in_a.back()).ok());
      ASSERT_TRUE(b.ReleaseSequence(in_b.back()).ok());
      in_a.pop_back();
      in_b.pop_back();
    }
    const int64_t rows = static_cast<int64_t>(in_a.size());
    const Tensor hidden = ToTensor(RandomHidden(rows, d, rng), {rows, d}, DType::kF32);
    absl::StatusOr<Tensor> out_a = a.Decode(in_a, hidden, {});
    absl::StatusOr<Tensor> out_b = b.Decode(in_b, hidden, {});
    ASSERT_TRUE(out_a.ok() && out_b.ok()) << out_a.status() << out_b.status();
    ASSERT_TRUE(SameBits(*out_a, *out_b)) << "a fork decoded differently from its copy";
  }
  for (size_t i = 0; i < in_a.size(); ++i) {
    EXPECT_EQ(a.SequenceLength(in_a[i]).value_or(-1), b.SequenceLength(in_b[i]).value_or(-2));
    ASSERT_TRUE(a.ReleaseSequence(in_a[i]).ok());
  }
  EXPECT_EQ(a.PoolUsage().used_pages, 0) << "the last holder of each page returns it";
}

INSTANTIATE_TEST_SUITE_P(Variants, KvForkTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

TEST(KvForkErrorsTest, UnknownSourceCountAndExhaustionChangeNothing) {
  const LayerSpec spec = StandardSpec(4, 4, 16, RopeLayout::kHalf);
  const LayerWeights weights = TestWeights(spec, 1);
  auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  KvCacheConfig config = Pool(4);
  config.budget = budget;
  absl::StatusOr<TestEngine> engine = MakeEngine(spec, weights, config);
  ASSERT_TRUE(engine.ok()) << engine.status();
  AttentionLayer& layer = *engine->layer;
  std::mt19937_64 rng(1);
  const SequenceId source = layer.CreateSequence();
  const PrefillChunk chunk{.sequence = source, .num_tokens = 20};  // One full page, one partial.
  ASSERT_TRUE(
      layer.Prefill({&chunk, 1}, ToTensor(RandomHidden(20, 64, rng), {20, 64}, DType::kF32), {})
          .ok());
  EXPECT_EQ(layer.ForkSequence(source + 100, 1).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<SequenceId>> none = layer.ForkSequence(source, 0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("fork count = 0"));
  // 2 of 4 pages used: 3 copies of the partial page do not fit, and nothing is taken.
  const int64_t used_bytes = budget->used_bytes();
  absl::StatusOr<std::vector<SequenceId>> too_many = layer.ForkSequence(source, 3);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(layer.PoolUsage().used_pages, 2);
  EXPECT_EQ(budget->used_bytes(), used_bytes);
  absl::StatusOr<std::vector<SequenceId>> two = layer.ForkSequence(source, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(layer.PoolUsage().used_pages, 4);
  EXPECT_EQ(budget->used_bytes(), 4 * layer.PoolUsage().page_bytes) << "shared pages count once";
  ASSERT_TRUE(layer.ReleaseSequence(source).ok());
  EXPECT_EQ(layer.PoolUsage().used_pages, 3) << "the shared page stays while forks hold it";
  for (SequenceId fork : *two) ASSERT_TRUE(layer.ReleaseSequence(fork).ok());
  EXPECT_EQ(layer.PoolUsage().used_pages, 0);
  EXPECT_EQ(budget->used_bytes(), 0);
}

}  // namespace
}  // namespace attnserve::reference

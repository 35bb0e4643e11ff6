// Moving a request at the layer (AttentionLayer::ExportSequence / ImportSequence,
// kernels/kv/sequence_table.h): a sequence exported mid-decode from one layer and imported into a
// second layer with the same weights decodes bit for bit as the unmoved original, for GQA, MLA and
// a sliding window whose leading pages were evicted before the export (they are not sent; the
// import holds only the pages a query can still see). Bad imports change nothing; an import's
// reservation (ReserveImport) pays for its pages.
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/kv/storage_format.h"
#include "tests/reference/attention_reference.h"
#include "tests/reference/test_cases.h"

namespace attnserve::reference {
namespace {

using ::testing::HasSubstr;

struct TransferCase {
  std::string name;
  LayerSpec spec;
  int64_t prompt = 37;        // Tokens; 37 = two full pages of 16 and a partial third.
  int64_t evicted_pages = 0;  // Leading pages a window has evicted at the export.
  // 8-bit pages keep their scales inside the page: copied verbatim, they must still decode.
  KvStorageFormat storage = DType::kF32;
};

std::vector<TransferCase> Cases() {
  std::vector<TransferCase> cases;
  cases.push_back({"gqa", StandardSpec(8, 2, 16, RopeLayout::kHalf)});
  cases.push_back({"gqa_full_pages", StandardSpec(8, 2, 16, RopeLayout::kHalf), 32});
  LayerSpec window = StandardSpec(4, 4, 16, RopeLayout::kHalf);
  window.sliding_window = 20;
  // 37 + 5 decoded = 42 tokens at the export: (42 - 20 + 1) / 16 = 1 page evicted.
  cases.push_back({"mha_window", window, 37, 1});
  cases.push_back({"mla", MlaSpec(0, 32, 16, 8, 16, RopeLayout::kInterleaved)});
  const KvStorageFormat fp8 = KvStorageFormat::Quantized(KvQuantization::kFp8E4M3);
  const KvStorageFormat int8 = KvStorageFormat::Quantized(KvQuantization::kInt8);
  cases.push_back({"gqa_fp8", StandardSpec(8, 2, 16, RopeLayout::kHalf), 37, 0, fp8});
  cases.push_back({"mha_window_int8", window, 37, 1, int8});
  cases.push_back({"mla_int8", MlaSpec(0, 32, 16, 8, 16, RopeLayout::kInterleaved), 37, 0, int8});
  return cases;
}

void PrintTo(const TransferCase& c, std::ostream* os) { *os << c.name; }

KvCacheConfig Pool(int64_t max_pages, std::shared_ptr<KvMemoryBudget> budget = nullptr,
                   KvStorageFormat storage = DType::kF32) {
  KvCacheConfig config;
  config.storage = storage;
  config.page_size = 16;
  config.max_pages = max_pages;
  config.budget = std::move(budget);
  return config;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.num_bytes()) == 0;
}

class KvTransferTest : public ::testing::TestWithParam<TransferCase> {};

TEST_P(KvTransferTest, ImportedSequenceDecodesAsTheUnmovedOriginal) {
  const TransferCase& c = GetParam();
  const int d = c.spec.d_model;
  const LayerWeights weights = TestWeights(c.spec, 23);
  ASSERT_FALSE(weights.empty());
  absl::StatusOr<TestEngine> source_engine =
      MakeEngine(c.spec, weights, Pool(64, nullptr, c.storage));
  absl::StatusOr<TestEngine> target_engine =
      MakeEngine(c.spec, weights, Pool(64, nullptr, c.storage));
  ASSERT_TRUE(source_engine.ok() && target_engine.ok())
      << source_engine.status() << target_engine.status();
  AttentionLayer& a = *source_engine->layer;
  AttentionLayer& b = *target_engine->layer;
  std::mt19937_64 rng(5);

  // A: prefill, decode 5 steps, export; B: import. Each layer also holds a decoy sequence first, so
  // the moved pages land on other page ids than they had.
  const SequenceId decoy = b.CreateSequence();
  const PrefillChunk decoy_chunk{.sequence = decoy, .num_tokens = 17};
  ASSERT_TRUE(
      b.Prefill({&decoy_chunk, 1}, ToTensor(RandomHidden(17, d, rng), {17, d}, DType::kF32), {})
          .ok());
  const SequenceId original = a.CreateSequence();
  const PrefillChunk chunk{.sequence = original, .num_tokens = c.prompt};
  ASSERT_TRUE(a.Prefill({&chunk, 1},
                        ToTensor(RandomHidden(c.prompt, d, rng), {c.prompt, d}, DType::kF32), {})
                  .ok());
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(
        a.Decode({&original, 1}, ToTensor(RandomHidden(1, d, rng), {1, d}, DType::kF32), {}).ok());
  }
  absl::StatusOr<SequenceExport> exported = a.ExportSequence(original);
  ASSERT_TRUE(exported.ok()) << exported.status();
  const int64_t length = c.prompt + 5;
  EXPECT_EQ(exported->num_tokens, length);
  EXPECT_EQ(exported->first_held_page, c.evicted_pages);
  const int64_t held = (length + 15) / 16 - c.evicted_pages;
  EXPECT_EQ(exported->page_bytes, a.PoolUsage().page_bytes);
  EXPECT_EQ(static_cast<int64_t>(exported->pages.size()), held * exported->page_bytes);
  EXPECT_EQ(a.SequenceLength(original).value_or(-1), length) << "export leaves the source as is";

  const int64_t target_pages_before = b.PoolUsage().used_pages;
  absl::StatusOr<SequenceId> moved = b.ImportSequence(*exported);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(b.SequenceLength(*moved).value_or(-1), length);
  EXPECT_EQ(b.PoolUsage().used_pages - target_pages_before, held)
      << "only the held pages are taken";
  EXPECT_EQ(b.SequenceKvBytes(*moved).value_or(-1), a.SequenceKvBytes(original).value_or(-2));

  // 16 more steps, the same inputs on both: the moved sequence decodes as the one that stayed
  // (and past another page boundary and, with the window, another eviction).
  for (int step = 0; step < 16; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const Tensor hidden = ToTensor(RandomHidden(1, d, rng), {1, d}, DType::kF32);
    absl::StatusOr<Tensor> out_a = a.Decode({&original, 1}, hidden, {});
    absl::StatusOr<Tensor> out_b = b.Decode({&*moved, 1}, hidden, {});
    ASSERT_TRUE(out_a.ok() && out_b.ok()) << out_a.status() << out_b.status();
    ASSERT_TRUE(SameBits(*out_a, *out_b)) << "the moved sequence decoded differently";
  }
  EXPECT_EQ(b.SequenceKvBytes(*moved).value_or(-1), a.SequenceKvBytes(original).value_or(-2));
  ASSERT_TRUE(b.ReleaseSequence(*moved).ok());
  ASSERT_TRUE(b.ReleaseSequence(decoy).ok());
  EXPECT_EQ(b.PoolUsage().used_pages, 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, KvTransferTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

TEST(KvTransferErrorsTest, BadImportsAreRefusedAndTakeNothing) {
  const LayerSpec spec = StandardSpec(4, 4, 16, RopeLayout::kHalf);
  const LayerWeights weights = TestWeights(spec, 1);
  auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  absl::StatusOr<TestEngine> source_engine = MakeEngine(spec, weights, Pool(8));
  absl::StatusOr<TestEngine> target_engine = MakeEngine(spec, weights, Pool(2, budget));
  ASSERT_TRUE(source_engine.ok() && target_engine.ok());
  AttentionLayer& a = *source_engine->layer;
  AttentionLayer& b = *target_engine->layer;
  std::mt19937_64 rng(1);
  EXPECT_EQ(a.ExportSequence(12345).status().code(), absl::StatusCode::kNotFound);

  const SequenceId seq = a.CreateSequence();
  const PrefillChunk chunk{.sequence = seq, .num_tokens = 40};  // 3 pages: more than B's 2.
  ASSERT_TRUE(
      a.Prefill({&chunk, 1}, ToTensor(RandomHidden(40, 64, rng), {40, 64}, DType::kF32), {}).ok());
  absl::StatusOr<SequenceExport> exported = a.ExportSequence(seq);
  ASSERT_TRUE(exported.ok()) << exported.status();

  SequenceExport short_bytes = *exported;
  short_bytes.pages.pop_back();
  absl::StatusOr<SequenceId> refused = b.ImportSequence(short_bytes);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("expected 3 held pages"));

  SequenceExport wrong_page = *exported;
  wrong_page.page_bytes /= 2;
  EXPECT_EQ(b.ImportSequence(wrong_page).status().code(), absl::StatusCode::kInvalidArgument);

  // No window: a missing leading page would be a key the next query attends to.
  SequenceExport evicted = *exported;
  evicted.first_held_page = 1;
  evicted.pages.erase(0, static_cast<size_t>(evicted.page_bytes));
  refused = b.ImportSequence(evicted);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("first_held_page = 1, must be in [0, 0]"));

  // 3 pages into a pool of 2: exhausted, and neither pool nor budget keeps anything.
  refused = b.ImportSequence(*exported);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.PoolUsage().used_pages, 0);
  EXPECT_EQ(budget->used_bytes(), 0);

  // A budget that refuses is named like a batch's refusal, and also takes nothing.
  auto small = std::make_shared<KvMemoryBudget>(2 * exported->page_bytes);
  absl::StatusOr<TestEngine> tight = MakeEngine(spec, weights, Pool(8, small));
  ASSERT_TRUE(tight.ok());
  refused = tight->layer->ImportSequence(*exported);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("this import needs"));
  EXPECT_EQ(small->used_bytes(), 0);
  EXPECT_EQ(tight->layer->PoolUsage().used_pages, 0);
}

// An import's bytes are its layer's from the header on (ReserveImport on a new, empty sequence),
// and the pages draw on them. One whose pages need more than the reservation and the budget can
// give (a sender that evicted fewer pages than its window allows) fails mid-way with nothing
// charged beyond the reservation, which its release gives back, and no sequence left behind.
TEST(KvTransferErrorsTest, AFailedImportLeavesNoBytesAndNoSequence) {
  LayerSpec spec = StandardSpec(4, 4, 16, RopeLayout::kHalf);
  spec.sliding_window = 20;
  const LayerWeights weights = TestWeights(spec, 3);
  absl::StatusOr<TestEngine> source_engine = MakeEngine(spec, weights, Pool(8));
  ASSERT_TRUE(source_engine.ok());
  AttentionLayer& a = *source_engine->layer;
  std::mt19937_64 rng(4);
  const SequenceId original = a.CreateSequence();
  const PrefillChunk chunk{.sequence = original, .num_tokens = 42};
  ASSERT_TRUE(
      a.Prefill({&chunk, 1}, ToTensor(RandomHidden(42, 64, rng), {42, 64}, DType::kF32), {}).ok());
  absl::StatusOr<SequenceExport> exported = a.ExportSequence(original);
  ASSERT_TRUE(exported.ok()) << exported.status();
  // 42 tokens with a window of 20: page 0 evicted, pages 1 and 2 held.
  ASSERT_EQ(exported->first_held_page, 1);
  const int64_t page_bytes = exported->page_bytes;
  ASSERT_EQ(static_cast<int64_t>(exported->pages.size()), 2 * page_bytes);
  // The same tokens with page 0 still held: valid, and one page more to take (evicted at once).
  SequenceExport unevicted = *exported;
  unevicted.first_held_page = 0;
  unevicted.pages = exported->pages.substr(0, static_cast<size_t>(page_bytes)) + exported->pages;

  // A budget of exactly what 42 tokens hold here: 2 pages.
  auto budget = std::make_shared<KvMemoryBudget>(2 * page_bytes);
  absl::StatusOr<TestEngine> target_engine = MakeEngine(spec, weights, Pool(8, budget));
  ASSERT_TRUE(target_engine.ok());
  AttentionLayer& b = *target_engine->layer;
  const SequenceId reserved = b.CreateSequence();
  ASSERT_TRUE(b.ReserveImport(reserved, 42).ok());
  EXPECT_EQ(budget->used_bytes(), 2 * page_bytes) << "the header's bytes, reserved";
  absl::Status failed = b.ImportSequenceInto(unevicted, reserved);
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(failed.message(), HasSubstr("this import needs"));
  EXPECT_EQ(budget->used_bytes(), 2 * page_bytes) << "only the reservation is still charged";
  EXPECT_EQ(b.PoolUsage().used_pages, 0);
  EXPECT_EQ(b.SequenceLength(reserved).value_or(-1), 0);
  ASSERT_TRUE(b.ReleaseSequence(reserved).ok());
  EXPECT_EQ(budget->used_bytes(), 0);

  // The same in one call (ImportSequence: its own sequence, no reservation): the sequence it made
  // is gone (ids are handed out in order), and nothing is charged.
  const SequenceId before = b.CreateSequence();
  absl::StatusOr<SequenceId> refused = b.ImportSequence(unevicted);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.SequenceLength(before + 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(budget->used_bytes(), 0);
  EXPECT_EQ(b.PoolUsage().used_pages, 0);
  ASSERT_TRUE(b.ReleaseSequence(before).ok());

  // The sender's own export fits its reservation exactly: the pages draw on it, nothing is
  // charged again, and the imported sequence holds no reservation (its release frees all).
  const SequenceId fits = b.CreateSequence();
  ASSERT_TRUE(b.ReserveImport(fits, 42).ok());
  ASSERT_TRUE(b.ImportSequenceInto(*exported, fits).ok());
  EXPECT_EQ(budget->used_bytes(), 2 * page_bytes);
  EXPECT_EQ(b.SequenceLength(fits).value_or(-1), 42);
  EXPECT_EQ(b.SequenceKvBytes(fits).value_or(-1), 2 * page_bytes);
  EXPECT_EQ(b.ImportSequenceInto(*exported, fits).code(), absl::StatusCode::kFailedPrecondition)
      << "an import fills a new sequence only";
  ASSERT_TRUE(b.ReleaseSequence(fits).ok());
  EXPECT_EQ(budget->used_bytes(), 0);
  EXPECT_EQ(b.PoolUsage().used_pages, 0);
}

}  // namespace
}  // namespace attnserve::reference

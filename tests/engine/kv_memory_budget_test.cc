// A KvMemoryBudget shared by several layers (as the server shares one per device): pages are
// charged on reservation, credited on release, eviction and layer destruction, and a batch that
// would pass the budget fails whole without touching any sequence.
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kv/sequence_table.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

LayerSpec SmallGqa(int window = 0) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 32;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 8;
  spec.rope = RopeLayout::kHalf;
  spec.sliding_window = window;
  return spec;
}

Tensor Ones(int64_t rows, int d_model) {
  return Tensor::FromFloats({rows, d_model}, std::vector<float>(rows * d_model, 0.5f));
}

TEST(KvMemoryBudgetTest, ChargesAndCreditsAcrossLayers) {
  auto backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  const LayerSpec spec = SmallGqa();
  const LayerWeights weights = *RandomLayerWeights(spec, 7);
  // 4 pages of 4 tokens: 2 KV heads * 8 dims * 2 (K, V) * 4 bytes * 4 tokens = 512 bytes a page.
  const int64_t page_bytes = 2 * 8 * 2 * 4 * 4;
  auto budget = std::make_shared<KvMemoryBudget>(4 * page_bytes);
  KvCacheConfig kv{.storage = DType::kF32, .page_size = 4, .max_pages = 100, .budget = budget};
  auto a = (*backend)->CreateLayer(spec, weights, kv);
  auto b = (*backend)->CreateLayer(spec, weights, kv);
  ASSERT_TRUE(a.ok() && b.ok());

  const SequenceId sa = (*a)->CreateSequence();
  const PrefillChunk chunk_a{sa, 9};  // 3 pages
  ASSERT_TRUE((*a)->Prefill({&chunk_a, 1}, Ones(9, spec.d_model), {}).ok());
  EXPECT_EQ(budget->used_bytes(), 3 * page_bytes);

  const SequenceId sb = (*b)->CreateSequence();
  const PrefillChunk chunk_b{sb, 5};  // 2 pages: one more than the budget has left.
  absl::StatusOr<Tensor> refused = (*b)->Prefill({&chunk_b, 1}, Ones(5, spec.d_model), {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("budget"));
  EXPECT_EQ(*(*b)->SequenceLength(sb), 0);
  EXPECT_EQ((*b)->PoolUsage().used_pages, 0);
  EXPECT_EQ(budget->used_bytes(), 3 * page_bytes);

  ASSERT_TRUE((*a)->ReleaseSequence(sa).ok());
  EXPECT_EQ(budget->used_bytes(), 0);
  ASSERT_TRUE((*b)->Prefill({&chunk_b, 1}, Ones(5, spec.d_model), {}).ok());
  EXPECT_EQ(budget->used_bytes(), 2 * page_bytes);
  b->reset();  // Destroying a layer (ending a session) credits what it still held.
  EXPECT_EQ(budget->used_bytes(), 0);
}

// A layer's own account (as the server gives each session one): bytes reserved ahead
// (TryReserve) and handed over with Prepay become the layer's charge without being released
// first, so another layer on the same pool cannot take them in between; what the layer does not
// take comes back with TakeCredit, still charged.
TEST(KvMemoryBudgetTest, AccountHandsAReservationToTheLayersCharge) {
  auto backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  const LayerSpec spec = SmallGqa();
  const LayerWeights weights = *RandomLayerWeights(spec, 7);
  const int64_t page_bytes = 2 * 8 * 2 * 4 * 4;
  auto pool = std::make_shared<KvMemoryBudget>(4 * page_bytes);
  auto account_a = KvMemoryBudget::Account(pool);
  auto account_b = KvMemoryBudget::Account(pool);
  EXPECT_TRUE(account_a->is_account());
  EXPECT_FALSE(pool->is_account());
  KvCacheConfig kv_a{.storage = DType::kF32, .page_size = 4, .max_pages = 100, .budget = account_a};
  KvCacheConfig kv_b{.storage = DType::kF32, .page_size = 4, .max_pages = 100, .budget = account_b};
  auto a = (*backend)->CreateLayer(spec, weights, kv_a);
  auto b = (*backend)->CreateLayer(spec, weights, kv_b);
  ASSERT_TRUE(a.ok() && b.ok());

  // A reserves 3 pages ahead; B's 2-page prefill no longer fits (the pool has 4).
  ASSERT_TRUE(account_a->TryReserve(3 * page_bytes));
  EXPECT_EQ(pool->used_bytes(), 3 * page_bytes);
  const SequenceId sb = (*b)->CreateSequence();
  const PrefillChunk chunk_b{sb, 5};
  absl::StatusOr<Tensor> refused = (*b)->Prefill({&chunk_b, 1}, Ones(5, spec.d_model), {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  // The refusal names the pool, not the account (which has no limit of its own).
  EXPECT_THAT(refused.status().message(), HasSubstr("of 2048 bytes are free"));

  // Two of A's pages handed over: A's 2-page prefill takes them, charging nothing new.
  account_a->Prepay(2 * page_bytes);
  const SequenceId sa = (*a)->CreateSequence();
  const PrefillChunk chunk_a{sa, 8};
  ASSERT_TRUE((*a)->Prefill({&chunk_a, 1}, Ones(8, spec.d_model), {}).ok());
  EXPECT_EQ(account_a->TakeCredit(), 0);
  EXPECT_EQ(pool->used_bytes(), 3 * page_bytes);
  // The last reserved page handed over; a 1-token step needs a new page and takes it.
  account_a->Prepay(page_bytes);
  const PrefillChunk one{sa, 1};
  ASSERT_TRUE((*a)->Prefill({&one, 1}, Ones(1, spec.d_model), {}).ok());
  EXPECT_EQ(account_a->TakeCredit(), 0);
  EXPECT_EQ(pool->used_bytes(), 3 * page_bytes);
  EXPECT_EQ(account_a->used_bytes(), 3 * page_bytes);
  // Credit the layer does not use comes back, still charged.
  ASSERT_TRUE(account_a->TryReserve(page_bytes));
  account_a->Prepay(page_bytes);
  const PrefillChunk fits{sa, 1};  // Fits the third page's free slots: no new page.
  ASSERT_TRUE((*a)->Prefill({&fits, 1}, Ones(1, spec.d_model), {}).ok());
  EXPECT_EQ(account_a->TakeCredit(), page_bytes);
  EXPECT_EQ(pool->used_bytes(), 4 * page_bytes);
  account_a->Release(page_bytes);
  EXPECT_EQ(pool->used_bytes(), 3 * page_bytes);
  a->reset();
  EXPECT_EQ(pool->used_bytes(), 0);
  EXPECT_EQ(account_a->used_bytes(), 0);
}

TEST(KvMemoryBudgetTest, SlidingWindowEvictionCreditsTheBudget) {
  auto backend = CreateCpuBackend({.num_threads = 1});
  ASSERT_TRUE(backend.ok());
  const LayerSpec spec = SmallGqa(/*window=*/4);
  const int64_t page_bytes = 2 * 8 * 2 * 4 * 4;
  auto budget = std::make_shared<KvMemoryBudget>(3 * page_bytes);
  KvCacheConfig kv{.storage = DType::kF32, .page_size = 4, .max_pages = 100, .budget = budget};
  auto layer = (*backend)->CreateLayer(spec, *RandomLayerWeights(spec, 3), kv);
  ASSERT_TRUE(layer.ok());
  const SequenceId id = (*layer)->CreateSequence();
  // 200 decode steps through a 3-page budget: only possible because windowed pages come back.
  for (int step = 0; step < 200; ++step) {
    ASSERT_TRUE((*layer)->Decode({&id, 1}, Ones(1, spec.d_model), {}).ok()) << "step " << step;
    ASSERT_LE(budget->used_bytes(), 2 * page_bytes) << "step " << step;
  }
}

}  // namespace
}  // namespace attnserve

// A KvMemoryBudget shared by several layers (as the server shares one per device): pages are
// charged on reservation, credited on release, eviction and layer destruction, and a batch that
// would pass the budget fails whole without touching any sequence.
#include "kernels/kv/memory_budget.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"

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

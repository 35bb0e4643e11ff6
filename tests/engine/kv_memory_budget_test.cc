// A KvMemoryBudget shared by several layers (as the server shares one per device): pages are
// charged on reservation, credited on release, eviction and layer destruction, and a batch that
// would pass the budget fails whole without touching any sequence; the reservations held ahead of
// a sequence's growth (KvReservations) are drawn on by its pages and by nothing else.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
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

// An import's reservation (AttentionLayer::ReserveImport, made when its header arrives) is held by
// its new sequence in the layer's ledger and becomes the import's pages without being released
// first, so another layer on the same pool cannot take the bytes while the pages are on their way.
TEST(KvMemoryBudgetTest, AnImportsReservationBecomesItsPagesAndNobodyElses) {
  auto backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  const LayerSpec spec = SmallGqa();
  const LayerWeights weights = *RandomLayerWeights(spec, 7);
  const int64_t page_bytes = 2 * 8 * 2 * 4 * 4;
  // The sender: 12 tokens, 3 pages, on no budget.
  auto sender = (*backend)->CreateLayer(spec, weights,
                                        {.storage = DType::kF32, .page_size = 4, .max_pages = 100});
  ASSERT_TRUE(sender.ok());
  const SequenceId sent = (*sender)->CreateSequence();
  const PrefillChunk prompt{sent, 12};
  ASSERT_TRUE((*sender)->Prefill({&prompt, 1}, Ones(12, spec.d_model), {}).ok());
  absl::StatusOr<SequenceExport> exported = (*sender)->ExportSequence(sent);
  ASSERT_TRUE(exported.ok()) << exported.status();

  auto pool = std::make_shared<KvMemoryBudget>(4 * page_bytes);
  KvCacheConfig kv{.storage = DType::kF32, .page_size = 4, .max_pages = 100, .budget = pool};
  auto a = (*backend)->CreateLayer(spec, weights, kv);
  auto b = (*backend)->CreateLayer(spec, weights, kv);
  ASSERT_TRUE(a.ok() && b.ok());

  // A reserves the import's 3 pages; B's 2-page prefill no longer fits (the pool has 4).
  const SequenceId into = (*a)->CreateSequence();
  ASSERT_TRUE((*a)->ReserveImport(into, 12).ok());
  EXPECT_EQ(pool->used_bytes(), 3 * page_bytes);
  const SequenceId sb = (*b)->CreateSequence();
  const PrefillChunk two_pages{sb, 5};
  absl::StatusOr<Tensor> refused = (*b)->Prefill({&two_pages, 1}, Ones(5, spec.d_model), {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);

  // The pages take the reservation's bytes: the pool's use does not move, and B is still refused.
  ASSERT_TRUE((*a)->ImportSequenceInto(*exported, into).ok());
  EXPECT_EQ(pool->used_bytes(), 3 * page_bytes);
  EXPECT_EQ(*(*a)->SequenceLength(into), 12);
  refused = (*b)->Prefill({&two_pages, 1}, Ones(5, spec.d_model), {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);

  // A second import the pool cannot hold is refused at its reservation, naming it, with nothing
  // charged; its sequence is released by whoever made it.
  const SequenceId second = (*a)->CreateSequence();
  absl::Status no_room = (*a)->ReserveImport(second, 12);
  EXPECT_EQ(no_room.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(no_room.message(), HasSubstr("this import needs"));
  EXPECT_EQ(pool->used_bytes(), 3 * page_bytes);
  ASSERT_TRUE((*a)->ReleaseSequence(second).ok());
  a->reset();
  EXPECT_EQ(pool->used_bytes(), 0);
}

// A sequence's reservation (AttentionLayer::ReserveKv) is charged once and held by the sequence in
// the layer's ledger: its later Prefill calls (a chunked Forward's chunks) draw on it without
// releasing it first, so another layer on the same budget cannot take the bytes between two
// chunks or inside one. A plain shared budget (no account) on purpose: before ReserveKv, the
// session released each chunk's share of its reservation there just before the layer charged it
// again.
TEST(KvMemoryBudgetTest, ASequencesReservationIsDrawnOnByItsChunksAndByNobodyElse) {
  auto backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  const LayerSpec spec = SmallGqa();
  const LayerWeights weights = *RandomLayerWeights(spec, 7);
  const int64_t page_bytes = 2 * 8 * 2 * 4 * 4;  // As above: pages of 4 tokens.
  auto pool = std::make_shared<KvMemoryBudget>(4 * page_bytes);
  KvCacheConfig kv{.storage = DType::kF32, .page_size = 4, .max_pages = 100, .budget = pool};
  auto a = (*backend)->CreateLayer(spec, weights, kv);
  auto b = (*backend)->CreateLayer(spec, weights, kv);
  ASSERT_TRUE(a.ok() && b.ok());

  // A reserves a 12-token prompt (3 pages) for its sequence; the pool has 4.
  const SequenceId sa = (*a)->CreateSequence();
  const int64_t prompt = 12;
  ASSERT_TRUE((*a)->ReserveKv({&sa, 1}, {&prompt, 1}).ok());
  EXPECT_EQ(pool->used_bytes(), 3 * page_bytes);
  const SequenceId sb = (*b)->CreateSequence();
  const PrefillChunk two_pages{sb, 5};
  const auto b_prefill = [&](const PrefillChunk& chunk) {
    return (*b)->Prefill({&chunk, 1}, Ones(chunk.num_tokens, spec.d_model), {});
  };
  EXPECT_EQ(b_prefill(two_pages).status().code(), absl::StatusCode::kResourceExhausted);

  // A's three chunks of 4 tokens take their pages from the reservation: the pool's use never
  // moves, and between the chunks B's allocation is still refused.
  const PrefillChunk chunk{sa, 4};
  for (int c = 0; c < 3; ++c) {
    ASSERT_TRUE((*a)->Prefill({&chunk, 1}, Ones(4, spec.d_model), {}).ok()) << "chunk " << c;
    EXPECT_EQ(pool->used_bytes(), 3 * page_bytes) << "chunk " << c;
    EXPECT_EQ(b_prefill(two_pages).status().code(), absl::StatusCode::kResourceExhausted)
        << "after chunk " << c;
  }
  // Spent: A's next page is a new charge, and the one page left is B's to take first.
  const PrefillChunk one_page{sb, 4};
  ASSERT_TRUE(b_prefill(one_page).ok());
  EXPECT_EQ(pool->used_bytes(), 4 * page_bytes);
  const PrefillChunk one_more{sa, 1};
  EXPECT_EQ((*a)->Prefill({&one_more, 1}, Ones(1, spec.d_model), {}).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE((*b)->ReleaseSequence(sb).ok());

  // A failed call gives back to the reservation what it drew, not to the pool: an output that
  // overflows rolls the call back, and the reservation holds as before.
  const int64_t four = 4;
  ASSERT_TRUE((*a)->ReserveKv({&sa, 1}, {&four, 1}).ok());  // One page (the 13th..16th tokens).
  EXPECT_EQ(pool->used_bytes(), 4 * page_bytes);
  const Tensor huge =
      Tensor::FromFloats({4, spec.d_model}, std::vector<float>(4 * spec.d_model, 3e38f));
  EXPECT_EQ((*a)->Prefill({&chunk, 1}, huge, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->used_bytes(), 4 * page_bytes);
  EXPECT_EQ(*(*a)->SequenceLength(sa), 12);
  const SequenceId sb2 = (*b)->CreateSequence();
  const PrefillChunk b_one{sb2, 1};
  EXPECT_EQ(b_prefill(b_one).status().code(), absl::StatusCode::kResourceExhausted)
      << "the rolled-back page went to the pool instead of back to A's reservation";
  ASSERT_TRUE((*a)->Prefill({&chunk, 1}, Ones(4, spec.d_model), {}).ok());
  EXPECT_EQ(pool->used_bytes(), 4 * page_bytes);

  // A reservation not drawn on is given back by 0 tokens, by ReleaseSequence, or with the layer.
  const int64_t none = 0;
  ASSERT_TRUE((*a)->ReleaseSequence(sa).ok());
  EXPECT_EQ(pool->used_bytes(), 0);
  const SequenceId sc = (*a)->CreateSequence();
  ASSERT_TRUE((*a)->ReserveKv({&sc, 1}, {&prompt, 1}).ok());
  EXPECT_EQ(pool->used_bytes(), 3 * page_bytes);
  ASSERT_TRUE((*a)->ReserveKv({&sc, 1}, {&none, 1}).ok());
  EXPECT_EQ(pool->used_bytes(), 0);
  ASSERT_TRUE((*a)->ReserveKv({&sc, 1}, {&prompt, 1}).ok());
  // Too much for the pool: refused whole, naming the bytes; the reservation held stays.
  const int64_t too_many = 20;
  absl::Status refused = (*a)->ReserveKv({&sc, 1}, {&too_many, 1});
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("this Forward needs"));
  EXPECT_EQ(pool->used_bytes(), 3 * page_bytes);
  ASSERT_TRUE((*a)->ReleaseSequence(sc).ok());
  EXPECT_EQ(pool->used_bytes(), 0);
  const SequenceId sd = (*a)->CreateSequence();
  ASSERT_TRUE((*a)->ReserveKv({&sd, 1}, {&prompt, 1}).ok());
  a->reset();
  EXPECT_EQ(pool->used_bytes(), 0);
}

// The reservation ledger alone (KvReservations, which KvSequenceTable and LayerStack share).
absl::Status Refused(const KvMemoryBudget& budget, int64_t bytes) {
  return absl::ResourceExhaustedError(absl::StrCat("refused ", bytes));
}

TEST(KvReservationsTest, ADrawTakesNoMoreThanIsReservedAndLeavesTheBudgetAlone) {
  auto budget = std::make_shared<KvMemoryBudget>(1000);
  KvReservations reservations;
  const std::vector<SequenceId> ids = {1, 2};
  ASSERT_TRUE(reservations.Set(ids, std::vector<int64_t>{300, 100}, budget.get(), Refused).ok());
  EXPECT_EQ(budget->used_bytes(), 400);
  EXPECT_EQ(reservations.total(), 400);

  // Past the reservation: only what is held is taken, and the sequence then holds none.
  EXPECT_EQ(reservations.Draw(1, 500), 300);
  EXPECT_EQ(reservations.Held(1), 0);
  EXPECT_EQ(reservations.Draw(1, 10), 0);
  EXPECT_EQ(reservations.Draw(3, 10), 0);  // Never reserved.
  EXPECT_EQ(reservations.Held(2), 100);
  EXPECT_EQ(reservations.total(), 100);
  // The drawn bytes pay for pages now: still charged.
  EXPECT_EQ(budget->used_bytes(), 400);

  // A rollback puts them back, still charged; a later Set counts them as held.
  reservations.Restore(1, 300);
  EXPECT_EQ(reservations.Held(1), 300);
  EXPECT_EQ(reservations.total(), 400);
  ASSERT_TRUE(
      reservations.Set({&ids[0], 1}, std::vector<int64_t>{350}, budget.get(), Refused).ok());
  EXPECT_EQ(budget->used_bytes(), 450);  // Only the growth is charged.
  // A smaller one gives the difference back; 0 gives it all.
  ASSERT_TRUE(reservations.Set(ids, std::vector<int64_t>{50, 0}, budget.get(), Refused).ok());
  EXPECT_EQ(budget->used_bytes(), 50);
  EXPECT_EQ(reservations.Held(2), 0);
  EXPECT_EQ(reservations.total(), 50);
}

TEST(KvReservationsTest, ReleaseOfAnUnknownSequenceChangesNothing) {
  auto budget = std::make_shared<KvMemoryBudget>(1000);
  KvReservations reservations;
  const SequenceId id = 7;
  ASSERT_TRUE(reservations.Set({&id, 1}, std::vector<int64_t>{200}, budget.get(), Refused).ok());
  EXPECT_EQ(reservations.Release(8), 0);
  EXPECT_EQ(reservations.Held(7), 200);
  EXPECT_EQ(reservations.total(), 200);
  // A known one is forgotten and its bytes are the owner's to give back: still charged here.
  EXPECT_EQ(reservations.Release(7), 200);
  EXPECT_EQ(reservations.Held(7), 0);
  EXPECT_EQ(reservations.total(), 0);
  EXPECT_EQ(budget->used_bytes(), 200);
  EXPECT_EQ(reservations.Release(7), 0);  // Twice: nothing left.
}

TEST(KvReservationsTest, ARefusedSetLeavesNoState) {
  // A tenant's quota inside the pool: the pool refuses though the tenant has room.
  auto pool = std::make_shared<KvMemoryBudget>(1000);
  auto tenant = std::make_shared<KvMemoryBudget>(5000, pool, "tenant 't'");
  ASSERT_TRUE(pool->TryCharge(600));  // Another session's pages.
  KvReservations reservations;
  const std::vector<SequenceId> ids = {1, 2};
  ASSERT_TRUE(
      reservations.Set({&ids[0], 1}, std::vector<int64_t>{200}, tenant.get(), Refused).ok());
  EXPECT_EQ(pool->used_bytes(), 800);

  // 300 + 300 is a growth of 400, 200 more than the pool has: refused whole, with the growth.
  absl::Status refused =
      reservations.Set(ids, std::vector<int64_t>{300, 300}, tenant.get(), Refused);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(), "refused 400");
  EXPECT_EQ(reservations.Held(1), 200);
  EXPECT_EQ(reservations.Held(2), 0);
  EXPECT_EQ(reservations.total(), 200);
  EXPECT_EQ(pool->used_bytes(), 800);
  EXPECT_EQ(tenant->used_bytes(), 200);

  // Without a budget nothing can refuse: the bytes are only counted.
  bool asked = false;
  ASSERT_TRUE(reservations
                  .Set(ids, std::vector<int64_t>{300, 300}, nullptr,
                       [&](const KvMemoryBudget&, int64_t) {
                         asked = true;
                         return absl::OkStatus();
                       })
                  .ok());
  EXPECT_FALSE(asked);
  EXPECT_EQ(reservations.total(), 600);
  EXPECT_EQ(pool->used_bytes(), 800);
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

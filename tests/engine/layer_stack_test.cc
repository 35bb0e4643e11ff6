// Hybrid stacks (kernels/stack/layer_stack.h): a stack computes exactly what its layers compute
// when run by hand on the residual stream (bit for bit, prefill then decode, in f32); a
// sliding-window layer's KV stays within its window while a global layer's grows with the context;
// forks decode as their source; a batch the budget cannot hold is refused with nothing changed, and
// a failure in a layer above the first drops the batch's sequences from every layer without leaking
// a page; in per-layer (model) mode each call runs one layer, in step order, the step's pages of
// every layer charged at layer 0; a sequence moves (export, import) over every layer, all or
// nothing.
#include "kernels/stack/layer_stack.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kv/sequence_table.h"
#include "tests/reference/attention_reference.h"
#include "tests/reference/test_cases.h"

namespace attnserve::reference {
namespace {

using ::testing::HasSubstr;

constexpr int kWindow = 20;  // Tokens; pages of 16, so a window layer holds at most 3 pages.

// Two sliding-window layers and a global one, GQA 4:2 with head dim 16 (d_model 64).
std::vector<LayerSpec> FiveToOneLikeSpecs() {
  std::vector<LayerSpec> specs(3, StandardSpec(4, 2, 16, RopeLayout::kHalf));
  specs[0].sliding_window = kWindow;
  specs[1].sliding_window = kWindow;
  specs[1].rope_theta = 10000.0 * 3;  // Per-layer RoPE bases, as Gemma 3's local layers.
  return specs;
}

std::vector<LayerWeights> WeightsFor(const std::vector<LayerSpec>& specs) {
  std::vector<LayerWeights> weights;
  for (size_t i = 0; i < specs.size(); ++i) weights.push_back(TestWeights(specs[i], 100 + i));
  return weights;
}

KvCacheConfig Pool(int64_t max_pages, std::shared_ptr<KvMemoryBudget> budget = nullptr) {
  KvCacheConfig config;
  config.storage = DType::kF32;
  config.page_size = 16;
  config.max_pages = max_pages;
  config.budget = std::move(budget);
  return config;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), a.num_bytes()) == 0;
}

void AddInto(Tensor& stream, const Tensor& out) {
  for (int64_t j = 0; j < stream.num_elements(); ++j) stream.f32()[j] += out.f32()[j];
}

int64_t KindBytes(const LayerStack& stack, const std::string& kind) {
  for (const LayerKindKv& k : stack.kv_usage()->Get()) {
    if (k.kind == kind) return k.kv_bytes;
  }
  return -1;
}

TEST(LayerStackTest, EqualsTheLayersRunByHandAndWindowLayersStayWithinTheirWindow) {
  const std::vector<LayerSpec> specs = FiveToOneLikeSpecs();
  const std::vector<LayerWeights> weights = WeightsFor(specs);
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  absl::StatusOr<std::unique_ptr<LayerStack>> stack =
      LayerStack::Create(**backend, specs, weights, Pool(256, budget));
  ASSERT_TRUE(stack.ok()) << stack.status();
  std::vector<std::unique_ptr<AttentionLayer>> by_hand;
  for (size_t k = 0; k < specs.size(); ++k) {
    absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
        (*backend)->CreateLayer(specs[k], weights[k], Pool(256));
    ASSERT_TRUE(layer.ok()) << layer.status();
    by_hand.push_back(*std::move(layer));
  }
  EXPECT_EQ((*stack)->num_layers(), 3);
  EXPECT_EQ(LayerKind(specs[0]), "sliding_window:20");
  EXPECT_EQ(LayerKind(specs[2]), "global");

  // Two sequences of 37 and 21 tokens (pages of 16: crossing page and window boundaries).
  const int64_t lengths[2] = {37, 21};
  std::mt19937_64 rng(7);
  const int d = specs[0].d_model;
  const Tensor prompt = ToTensor(RandomHidden(58, d, rng), {58, d}, DType::kF32);
  std::vector<SequenceId> s_ids = {(*stack)->CreateSequence(), (*stack)->CreateSequence()};
  std::vector<std::vector<SequenceId>> h_ids(3);
  for (size_t k = 0; k < 3; ++k) {
    h_ids[k] = {by_hand[k]->CreateSequence(), by_hand[k]->CreateSequence()};
  }
  const PrefillChunk chunks[2] = {{s_ids[0], lengths[0]}, {s_ids[1], lengths[1]}};
  absl::StatusOr<Tensor> stacked = (*stack)->Prefill(chunks, prompt, {});
  ASSERT_TRUE(stacked.ok()) << stacked.status();
  Tensor stream = prompt;
  for (size_t k = 0; k < 3; ++k) {
    const PrefillChunk layer_chunks[2] = {{h_ids[k][0], lengths[0]}, {h_ids[k][1], lengths[1]}};
    absl::StatusOr<Tensor> out = by_hand[k]->Prefill(layer_chunks, stream, {});
    ASSERT_TRUE(out.ok()) << out.status();
    AddInto(stream, *out);
  }
  ASSERT_TRUE(SameBits(*stacked, stream)) << "prefill differs from the layers run by hand";

  // Decode 40 steps: the window layers' pages stop growing, the global layer's keep growing.
  const int64_t page_bytes = (*stack)->PoolUsage().page_bytes;
  for (int step = 0; step < 40; ++step) {
    const Tensor x = ToTensor(RandomHidden(2, d, rng), {2, d}, DType::kF32);
    absl::StatusOr<Tensor> s_out = (*stack)->Decode(s_ids, x, {});
    ASSERT_TRUE(s_out.ok()) << s_out.status();
    Tensor h = x;
    for (size_t k = 0; k < 3; ++k) {
      absl::StatusOr<Tensor> out = by_hand[k]->Decode(h_ids[k], h, {});
      ASSERT_TRUE(out.ok()) << out.status();
      AddInto(h, *out);
    }
    ASSERT_TRUE(SameBits(*s_out, h)) << "decode step " << step << " differs";
    // A window of 20 tokens spans at most 3 pages of 16 (2 window layers x 2 sequences).
    EXPECT_LE(KindBytes(**stack, "sliding_window:20"), 2 * 2 * 3 * page_bytes);
  }
  const int64_t global_pages =
      PagesForTokens(lengths[0] + 40, 16) + PagesForTokens(lengths[1] + 40, 16);
  EXPECT_EQ(KindBytes(**stack, "global"), global_pages * page_bytes);
  EXPECT_EQ((*stack)->PoolUsage().used_pages * page_bytes, budget->used_bytes())
      << "the stack charges exactly the pages its layers hold";
  EXPECT_EQ((*stack)->SequenceKvBytes(s_ids[0]).value_or(-1),
            (*stack)->KvBytesAtLength(lengths[0] + 40));

  // bf16 in, bf16 out: the residual stream is f32 inside.
  const Tensor x16 = ToTensor(RandomHidden(2, d, rng), {2, d}, DType::kBF16);
  absl::StatusOr<Tensor> out16 = (*stack)->Decode(s_ids, x16, {});
  ASSERT_TRUE(out16.ok()) << out16.status();
  EXPECT_EQ(out16->dtype(), DType::kBF16);

  for (SequenceId id : s_ids) ASSERT_TRUE((*stack)->ReleaseSequence(id).ok());
  EXPECT_EQ((*stack)->PoolUsage().used_pages, 0);
  EXPECT_EQ(budget->used_bytes(), 0);
  EXPECT_EQ(KindBytes(**stack, "global"), 0);
}

TEST(LayerStackTest, ForksDecodeAsTheirSource) {
  const std::vector<LayerSpec> specs = FiveToOneLikeSpecs();
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  absl::StatusOr<std::unique_ptr<LayerStack>> stack =
      LayerStack::Create(**backend, specs, WeightsFor(specs), Pool(256, budget));
  ASSERT_TRUE(stack.ok()) << stack.status();
  std::mt19937_64 rng(11);
  const int d = specs[0].d_model;
  const SequenceId source = (*stack)->CreateSequence();
  const PrefillChunk chunk{source, 37};
  ASSERT_TRUE(
      (*stack)
          ->Prefill({&chunk, 1}, ToTensor(RandomHidden(37, d, rng), {37, d}, DType::kF32), {})
          .ok());
  const int64_t before = budget->used_bytes();
  absl::StatusOr<std::vector<SequenceId>> forks = (*stack)->ForkSequence(source, 2);
  ASSERT_TRUE(forks.ok()) << forks.status();
  // Each fork copies the partial last page in each of the 3 layers.
  EXPECT_EQ(budget->used_bytes(), before + 2 * 3 * (*stack)->PoolUsage().page_bytes);
  for (int step = 0; step < 24; ++step) {
    const std::vector<double> row = RandomHidden(1, d, rng);
    std::vector<double> rows;
    for (int i = 0; i < 3; ++i) rows.insert(rows.end(), row.begin(), row.end());
    const std::vector<SequenceId> ids = {source, (*forks)[0], (*forks)[1]};
    absl::StatusOr<Tensor> out = (*stack)->Decode(ids, ToTensor(rows, {3, d}, DType::kF32), {});
    ASSERT_TRUE(out.ok()) << out.status();
    for (int i = 1; i < 3; ++i) {
      ASSERT_EQ(std::memcmp(out->data(), out->data() + i * d * 4, d * 4), 0)
          << "fork " << i << " decoded differently from its source at step " << step;
    }
  }
  ASSERT_TRUE((*stack)->ReleaseSequence(source).ok());
  for (SequenceId f : *forks) ASSERT_TRUE((*stack)->ReleaseSequence(f).ok());
  EXPECT_EQ(budget->used_bytes(), 0);
}

TEST(LayerStackTest, BudgetExhaustionIsRefusedBeforeAnyLayerChanges) {
  const std::vector<LayerSpec> specs = FiveToOneLikeSpecs();
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  // Room for 8 pages in all: a 37-token prompt needs 3 pages in each of 3 layers (9).
  absl::StatusOr<std::unique_ptr<LayerStack>> probe =
      LayerStack::Create(**backend, specs, WeightsFor(specs), Pool(256));
  ASSERT_TRUE(probe.ok());
  const int64_t page_bytes = (*probe)->PoolUsage().page_bytes;
  auto budget = std::make_shared<KvMemoryBudget>(8 * page_bytes);
  absl::StatusOr<std::unique_ptr<LayerStack>> stack =
      LayerStack::Create(**backend, specs, WeightsFor(specs), Pool(256, budget));
  ASSERT_TRUE(stack.ok());
  std::mt19937_64 rng(5);
  const int d = specs[0].d_model;
  const SequenceId id = (*stack)->CreateSequence();
  const PrefillChunk chunk{id, 37};
  absl::StatusOr<Tensor> out =
      (*stack)->Prefill({&chunk, 1}, ToTensor(RandomHidden(37, d, rng), {37, d}, DType::kF32), {});
  ASSERT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  EXPECT_THAT(out.status().message(), HasSubstr("3 stacked layers"));
  EXPECT_EQ(budget->used_bytes(), 0);
  EXPECT_EQ((*stack)->PoolUsage().used_pages, 0);
  EXPECT_EQ((*stack)->SequenceLength(id).value_or(-1), 0);
  const PrefillChunk fits{id, 32};  // 2 pages x 3 layers.
  EXPECT_TRUE(
      (*stack)
          ->Prefill({&fits, 1}, ToTensor(RandomHidden(32, d, rng), {32, d}, DType::kF32), {})
          .ok());
  EXPECT_EQ(budget->used_bytes(), 6 * page_bytes);
}

// ReserveKv on a stack: the bytes every layer's pages will take for the planned tokens, charged
// once to the stack's budget and drawn on by the sequence's chunks, so another charger cannot take
// them between two chunks; what is left goes back with 0 tokens or the sequence.
TEST(LayerStackTest, AReservationIsDrawnOnByTheSequencesChunks) {
  const std::vector<LayerSpec> specs = FiveToOneLikeSpecs();
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  absl::StatusOr<std::unique_ptr<LayerStack>> probe =
      LayerStack::Create(**backend, specs, WeightsFor(specs), Pool(256));
  ASSERT_TRUE(probe.ok());
  const int64_t page_bytes = (*probe)->PoolUsage().page_bytes;
  // 32 tokens: 2 pages in each of 3 layers (the windows evict nothing yet), the whole budget.
  auto budget = std::make_shared<KvMemoryBudget>(6 * page_bytes);
  absl::StatusOr<std::unique_ptr<LayerStack>> stack =
      LayerStack::Create(**backend, specs, WeightsFor(specs), Pool(256, budget));
  ASSERT_TRUE(stack.ok());
  std::mt19937_64 rng(9);
  const int d = specs[0].d_model;
  const SequenceId id = (*stack)->CreateSequence();
  const int64_t planned = 32;
  ASSERT_TRUE((*stack)->ReserveKv({&id, 1}, {&planned, 1}).ok());
  EXPECT_EQ(budget->used_bytes(), 6 * page_bytes);
  EXPECT_FALSE(budget->TryCharge(page_bytes)) << "another charger took the reserved bytes";
  const PrefillChunk chunk{id, 16};
  for (int c = 0; c < 2; ++c) {
    ASSERT_TRUE(
        (*stack)
            ->Prefill({&chunk, 1}, ToTensor(RandomHidden(16, d, rng), {16, d}, DType::kF32), {})
            .ok())
        << "chunk " << c;
    EXPECT_EQ(budget->used_bytes(), 6 * page_bytes) << "chunk " << c;
    EXPECT_FALSE(budget->TryCharge(page_bytes)) << "after chunk " << c;
  }
  EXPECT_EQ((*stack)->PoolUsage().used_pages, 6);
  // A second reservation, given back unused with 0 tokens.
  const int64_t more = 16;
  const int64_t none = 0;
  ASSERT_TRUE((*stack)->ReleaseSequence(id).ok());
  EXPECT_EQ(budget->used_bytes(), 0);
  const SequenceId other = (*stack)->CreateSequence();
  ASSERT_TRUE((*stack)->ReserveKv({&other, 1}, {&more, 1}).ok());
  EXPECT_EQ(budget->used_bytes(), 3 * page_bytes);
  ASSERT_TRUE((*stack)->ReserveKv({&other, 1}, {&none, 1}).ok());
  EXPECT_EQ(budget->used_bytes(), 0);
  ASSERT_TRUE((*stack)->ReserveKv({&other, 1}, {&more, 1}).ok());
  stack->reset();
  EXPECT_EQ(budget->used_bytes(), 0);
}

TEST(LayerStackTest, FailureAboveTheFirstLayerDropsTheBatchWithoutLeaking) {
  const std::vector<LayerSpec> specs = FiveToOneLikeSpecs();
  std::vector<LayerWeights> weights = WeightsFor(specs);
  // Layer 1's V and O projections scaled so far that its output overflows to infinity: layer 0
  // has appended the batch by then, and layer 1 rolls only its own call back.
  for (const char* name : {"v_proj.weight", "o_proj.weight"}) {
    Tensor& w = weights[1].at(name);
    for (int64_t j = 0; j < w.num_elements(); ++j) w.f32()[j] *= 1e20f;
  }
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  absl::StatusOr<std::unique_ptr<LayerStack>> stack =
      LayerStack::Create(**backend, specs, weights, Pool(256, budget));
  ASSERT_TRUE(stack.ok()) << stack.status();
  std::mt19937_64 rng(9);
  const int d = specs[0].d_model;
  const SequenceId id = (*stack)->CreateSequence();
  const PrefillChunk chunk{id, 21};
  absl::StatusOr<Tensor> out =
      (*stack)->Prefill({&chunk, 1}, ToTensor(RandomHidden(21, d, rng), {21, d}, DType::kF32), {});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("stack layer 1 failed"));
  EXPECT_THAT(out.status().message(), HasSubstr("dropped"));
  EXPECT_EQ((*stack)->PoolUsage().used_pages, 0) << "layer 0's pages went back";
  EXPECT_EQ(budget->used_bytes(), 0);
  absl::StatusOr<int64_t> length = (*stack)->SequenceLength(id);
  EXPECT_EQ(length.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(length.status().message(), HasSubstr("was dropped"));
  EXPECT_TRUE((*stack)->ReleaseSequence(id).ok());
}

// Per-layer (model) mode: each call runs one layer, which computes what that layer alone does;
// layer 0 charges the step's pages of every layer, the charge equals the pages held once a step
// is over (window layers' evictions handed back), calls out of order change nothing, and a
// release in mid-step gives back the pages and what was still reserved.
TEST(LayerStackTest, PerLayerModeRunsOneLayerPerCallInStepOrder) {
  const std::vector<LayerSpec> specs = FiveToOneLikeSpecs();
  const std::vector<LayerWeights> weights = WeightsFor(specs);
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  absl::StatusOr<std::unique_ptr<LayerStack>> stack =
      LayerStack::Create(**backend, specs, weights, Pool(256, budget), StackMode::kPerLayer);
  ASSERT_TRUE(stack.ok()) << stack.status();
  std::vector<std::unique_ptr<AttentionLayer>> by_hand;
  for (size_t k = 0; k < specs.size(); ++k) {
    absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
        (*backend)->CreateLayer(specs[k], weights[k], Pool(256));
    ASSERT_TRUE(layer.ok()) << layer.status();
    by_hand.push_back(*std::move(layer));
  }
  const int64_t page_bytes = (*stack)->PoolUsage().page_bytes;
  std::mt19937_64 rng(17);
  const int d = specs[0].d_model;
  const SequenceId id = (*stack)->CreateSequence();
  std::vector<SequenceId> hand_ids;
  for (auto& layer : by_hand) hand_ids.push_back(layer->CreateSequence());

  // The whole-stack calls belong to residual mode.
  const PrefillChunk chunk{id, 37};
  const Tensor prompt = ToTensor(RandomHidden(37, d, rng), {37, d}, DType::kF32);
  EXPECT_EQ((*stack)->Prefill({&chunk, 1}, prompt, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (int k = 0; k < 3; ++k) {
    absl::StatusOr<Tensor> out = (*stack)->PrefillLayer(k, {&chunk, 1}, prompt, {});
    ASSERT_TRUE(out.ok()) << "layer " << k << ": " << out.status();
    const PrefillChunk hand{hand_ids[k], 37};
    absl::StatusOr<Tensor> expected = by_hand[k]->Prefill({&hand, 1}, prompt, {});
    ASSERT_TRUE(expected.ok());
    EXPECT_TRUE(SameBits(*out, *expected)) << "layer " << k;
    if (k == 0) {
      // 3 pages in each of 3 layers charged now; layer 0 (window 20) already evicted its first
      // page and handed it back, layers 1 and 2 hold none yet (their 3 + 3 are reserved).
      EXPECT_EQ(budget->used_bytes(), (2 + 3 + 3) * page_bytes);
      EXPECT_EQ((*stack)->PoolUsage().used_pages, 2);
      EXPECT_EQ((*stack)->NextLayer(id), 1);
    }
  }
  EXPECT_EQ((*stack)->NextLayer(id), 0);
  for (int step = 0; step < 12; ++step) {
    const Tensor hidden = ToTensor(RandomHidden(1, d, rng), {1, d}, DType::kF32);
    const std::vector<int64_t> position = {37 + step};
    for (int k = 0; k < 3; ++k) {
      absl::StatusOr<Tensor> out = (*stack)->DecodeLayer(k, {&id, 1}, hidden, position);
      ASSERT_TRUE(out.ok()) << "step " << step << " layer " << k << ": " << out.status();
      absl::StatusOr<Tensor> expected = by_hand[k]->Decode({&hand_ids[k], 1}, hidden, position);
      ASSERT_TRUE(expected.ok());
      EXPECT_TRUE(SameBits(*out, *expected)) << "step " << step << " layer " << k;
    }
    // Between steps the charge is exactly the pages held (window evictions handed back).
    EXPECT_EQ(budget->used_bytes(), (*stack)->PoolUsage().used_pages * page_bytes);
  }

  // Out of order, with nothing changed: layer 1 with no step, then in mid-step a new step, a
  // skipped layer, another row count; and a layer out of range.
  const Tensor one = ToTensor(RandomHidden(1, d, rng), {1, d}, DType::kF32);
  const std::vector<int64_t> next = {49};
  absl::Status s = (*stack)->DecodeLayer(1, {&id, 1}, one, next).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("layer 1 out of order"));
  ASSERT_TRUE((*stack)->DecodeLayer(0, {&id, 1}, one, next).ok());
  const int64_t charged = budget->used_bytes();
  const int64_t held = (*stack)->PoolUsage().used_pages;
  const std::vector<int64_t> after_next = {50};
  s = (*stack)->DecodeLayer(0, {&id, 1}, one, after_next).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("run layer 1 next"));
  s = (*stack)->DecodeLayer(2, {&id, 1}, one, next).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  const PrefillChunk two{id, 2};
  const std::vector<int64_t> two_positions = {49, 50};
  s = (*stack)
          ->PrefillLayer(1, {&two, 1}, ToTensor(RandomHidden(2, d, rng), {2, d}, DType::kF32),
                         two_positions)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ((*stack)->DecodeLayer(3, {&id, 1}, one, next).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(budget->used_bytes(), charged);
  EXPECT_EQ((*stack)->PoolUsage().used_pages, held);
  EXPECT_EQ((*stack)->NextLayer(id), 1);
  // Released in mid-step: every page and the reservation go back.
  ASSERT_TRUE((*stack)->ReleaseSequence(id).ok());
  EXPECT_EQ(budget->used_bytes(), 0);
  EXPECT_EQ((*stack)->PoolUsage().used_pages, 0);
}

// Moving a sequence (ExportSequence / ImportSequence): every layer's held pages in one export, a
// window layer's evicted ones left out; the imported sequence decodes bit for bit as its unmoved
// twin; the import charges the budget once for all layers.
TEST(LayerStackTest, ExportImportMovesASequenceOverEveryLayer) {
  const std::vector<LayerSpec> specs = FiveToOneLikeSpecs();
  const std::vector<LayerWeights> weights = WeightsFor(specs);
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  auto source_budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  auto target_budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  absl::StatusOr<std::unique_ptr<LayerStack>> source =
      LayerStack::Create(**backend, specs, weights, Pool(256, source_budget));
  absl::StatusOr<std::unique_ptr<LayerStack>> target =
      LayerStack::Create(**backend, specs, weights, Pool(256, target_budget));
  ASSERT_TRUE(source.ok() && target.ok());
  const int64_t page_bytes = (*source)->PoolUsage().page_bytes;
  std::mt19937_64 rng(21);
  const int d = specs[0].d_model;
  const SequenceId moved = (*source)->CreateSequence();
  const SequenceId twin = (*source)->CreateSequence();
  // The same 37-token prompt and 10 decode steps, one call each (equal shapes, equal bits).
  const Tensor prompt = ToTensor(RandomHidden(37, d, rng), {37, d}, DType::kF32);
  for (SequenceId id : {moved, twin}) {
    const PrefillChunk chunk{id, 37};
    ASSERT_TRUE((*source)->Prefill({&chunk, 1}, prompt, {}).ok());
  }
  for (int step = 0; step < 10; ++step) {
    const Tensor hidden = ToTensor(RandomHidden(1, d, rng), {1, d}, DType::kF32);
    for (SequenceId id : {moved, twin}) ASSERT_TRUE((*source)->Decode({id}, hidden, {}).ok());
  }

  absl::StatusOr<SequenceExport> exported = (*source)->ExportSequence(moved);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->num_tokens, 47);
  EXPECT_EQ(exported->page_bytes, page_bytes);
  ASSERT_EQ(exported->layers.size(), 3u);
  int64_t held = 0;
  for (size_t k = 0; k < 3; ++k) {
    const LayerExtent& part = exported->layers[k];
    EXPECT_EQ(part.num_tokens, 47);
    EXPECT_EQ(part.first_held_page + part.held_pages, 3) << "47 tokens: 3 pages, layer " << k;
    held += part.held_pages;
  }
  // Window 20 at 47 tokens: the last token sees 27..46, so page 0 is gone in layers 0 and 1.
  EXPECT_EQ(exported->layers[0].first_held_page, 1);
  EXPECT_EQ(exported->layers[1].first_held_page, 1);
  EXPECT_EQ(exported->layers[2].first_held_page, 0);
  EXPECT_EQ(static_cast<int64_t>(exported->pages.size()), held * page_bytes);

  absl::StatusOr<SequenceId> imported = (*target)->ImportSequence(*exported);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(target_budget->used_bytes(), held * page_bytes) << "charged once, for every layer";
  EXPECT_EQ((*target)->SequenceLength(*imported).value_or(-1), 47);
  for (int step = 0; step < 8; ++step) {
    const Tensor hidden = ToTensor(RandomHidden(1, d, rng), {1, d}, DType::kF32);
    absl::StatusOr<Tensor> there = (*target)->Decode({*imported}, hidden, {});
    absl::StatusOr<Tensor> here = (*source)->Decode({twin}, hidden, {});
    ASSERT_TRUE(there.ok() && here.ok());
    EXPECT_TRUE(SameBits(*there, *here)) << "step " << step;
  }
  ASSERT_TRUE((*target)->ReleaseSequence(*imported).ok());
  EXPECT_EQ(target_budget->used_bytes(), 0);
}

// An import checks every layer before any changes (layer count, extents, each layer's pool, the
// budget), and a layer that still refuses its pages undoes the layers before it. A sequence in
// mid-step (per-layer mode) is not exported.
TEST(LayerStackTest, ImportIsAllOrNothingAndMidStepExportIsRefused) {
  const std::vector<LayerSpec> specs = FiveToOneLikeSpecs();
  const std::vector<LayerWeights> weights = WeightsFor(specs);
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  auto budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  absl::StatusOr<std::unique_ptr<LayerStack>> source =
      LayerStack::Create(**backend, specs, weights, Pool(256, budget), StackMode::kPerLayer);
  ASSERT_TRUE(source.ok());
  const int64_t page_bytes = (*source)->PoolUsage().page_bytes;
  std::mt19937_64 rng(29);
  const int d = specs[0].d_model;
  const SequenceId id = (*source)->CreateSequence();
  const PrefillChunk chunk{id, 40};
  const Tensor prompt = ToTensor(RandomHidden(40, d, rng), {40, d}, DType::kF32);
  ASSERT_TRUE((*source)->PrefillLayer(0, {&chunk, 1}, prompt, {}).ok());
  absl::StatusOr<SequenceExport> mid_step = (*source)->ExportSequence(id);
  EXPECT_EQ(mid_step.status().code(), absl::StatusCode::kFailedPrecondition) << mid_step.status();
  EXPECT_THAT(mid_step.status().message(), HasSubstr("is mid-step"));
  EXPECT_THAT(mid_step.status().message(), HasSubstr("layer 1 runs next"));
  for (int k = 1; k < 3; ++k) ASSERT_TRUE((*source)->PrefillLayer(k, {&chunk, 1}, prompt, {}).ok());
  absl::StatusOr<SequenceExport> exported = (*source)->ExportSequence(id);
  ASSERT_TRUE(exported.ok()) << exported.status();
  int64_t held = 0;
  for (const LayerExtent& part : exported->layers) held += part.held_pages;

  const auto expect_untouched = [&](const LayerStack& stack, const KvMemoryBudget* target_budget,
                                    const std::string& what) {
    EXPECT_EQ(stack.PoolUsage().used_pages, 0) << what;
    if (target_budget != nullptr) EXPECT_EQ(target_budget->used_bytes(), 0) << what;
  };
  auto target_budget = std::make_shared<KvMemoryBudget>(int64_t{1} << 30);
  absl::StatusOr<std::unique_ptr<LayerStack>> target =
      LayerStack::Create(**backend, specs, weights, Pool(256, target_budget), StackMode::kPerLayer);
  ASSERT_TRUE(target.ok());

  // Layer 2 (global) said to have evicted its first page: layers 0 and 1 import, layer 2
  // refuses, and the two are undone.
  SequenceExport lying = *exported;
  lying.layers[2].first_held_page = 1;
  lying.layers[2].held_pages -= 1;
  lying.pages.erase(
      static_cast<size_t>((lying.layers[0].held_pages + lying.layers[1].held_pages) * page_bytes),
      static_cast<size_t>(page_bytes));
  absl::StatusOr<SequenceId> refused = (*target)->ImportSequence(lying);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("layers[2]: "));
  expect_untouched(**target, target_budget.get(), "layer 2 refused");

  // Another layer count, another length in one layer, bytes that do not add up.
  SequenceExport fewer_layers = *exported;
  fewer_layers.layers.pop_back();
  refused = (*target)->ImportSequence(fewer_layers);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("the export holds 2 layers, this stack 3"));
  SequenceExport uneven = *exported;
  uneven.layers[1].num_tokens = 39;
  refused = (*target)->ImportSequence(uneven);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("layers[1].num_tokens = 39"));
  SequenceExport short_bytes = *exported;
  short_bytes.pages.pop_back();
  refused = (*target)->ImportSequence(short_bytes);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  expect_untouched(**target, target_budget.get(), "malformed");

  // A budget one page short, and a layer pool of 2 pages (layer 2 holds 3).
  auto small = std::make_shared<KvMemoryBudget>((held - 1) * page_bytes);
  absl::StatusOr<std::unique_ptr<LayerStack>> poor =
      LayerStack::Create(**backend, specs, weights, Pool(256, small), StackMode::kPerLayer);
  ASSERT_TRUE(poor.ok());
  refused = (*poor)->ImportSequence(*exported);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  expect_untouched(**poor, small.get(), "budget");
  absl::StatusOr<std::unique_ptr<LayerStack>> narrow =
      LayerStack::Create(**backend, specs, weights, Pool(2, target_budget), StackMode::kPerLayer);
  ASSERT_TRUE(narrow.ok());
  refused = (*narrow)->ImportSequence(*exported);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("in layer 2"));
  expect_untouched(**narrow, target_budget.get(), "layer pool");

  // The true export imports, and the step order starts afresh at layer 0.
  absl::StatusOr<SequenceId> imported = (*target)->ImportSequence(*exported);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(target_budget->used_bytes(), held * page_bytes);
  EXPECT_EQ((*target)->NextLayer(*imported), 0);
  const Tensor token = ToTensor(RandomHidden(1, d, rng), {1, d}, DType::kF32);
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE((*target)->DecodeLayer(k, {*imported}, token, {}).ok()) << "layer " << k;
  }
}

TEST(LayerStackTest, RefusesMismatchedLayersByName) {
  std::vector<LayerSpec> specs = FiveToOneLikeSpecs();
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend({.num_threads = 2});
  ASSERT_TRUE(backend.ok());
  std::vector<LayerSpec> wide = specs;
  wide[2].d_model = 128;
  absl::StatusOr<std::unique_ptr<LayerStack>> stack =
      LayerStack::Create(**backend, wide, WeightsFor(wide), Pool(16));
  ASSERT_EQ(stack.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stack.status().message(), HasSubstr("stack.layers[2].d_model = 128"));
  std::vector<LayerSpec> heads = specs;
  heads[1] = StandardSpec(4, 4, 16, RopeLayout::kHalf);  // 4 KV heads: twice the page bytes.
  stack = LayerStack::Create(**backend, heads, WeightsFor(heads), Pool(16));
  ASSERT_EQ(stack.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stack.status().message(), HasSubstr("stack.layers[1]: KV pages"));
  stack = LayerStack::Create(**backend, {}, {}, Pool(16));
  EXPECT_EQ(stack.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnserve::reference

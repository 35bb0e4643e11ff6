#include "kernels/cuda/flashinfer/prefill_plan.h"

#include <algorithm>
#include <limits>

namespace attnserve::cuda {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// FlashInfer's AlignedAllocator puts each array on a 16-byte boundary; we keep that layout.
int AlignTo16Bytes(size_t elements) {
  constexpr size_t kPerLine = 16 / sizeof(int32_t);
  return static_cast<int>(CeilDiv(static_cast<int64_t>(elements), kPerLine) * kPerLine);
}

}  // namespace

int FlashInferPrefillCtaTileQ(int64_t avg_packed_qo_len, int head_dim) {
  // FA2DetermineCtaTileQ (flashinfer/utils.cuh) on sm80 and later (CUDA_ARCHITECTURES are 80;90),
  // its 16-row tile folded into 64 (see the header).
  if (avg_packed_qo_len > 64 && head_dim < 256) return 128;
  return 64;
}

std::optional<FlashInferPrefillPlan> PlanFlashInferPrefill(
    const std::vector<FlashInferPrefillSequence>& sequences, int group_size, int head_dim) {
  if (sequences.empty() || group_size < 1 || head_dim < 1) return std::nullopt;
  int64_t total_rows = 0, total_packed_rows = 0, max_kv_len = 0;
  for (const FlashInferPrefillSequence& s : sequences) {
    if (s.qo_len < 0 || s.kv_len < s.qo_len) return std::nullopt;
    total_rows += s.qo_len;
    total_packed_rows += int64_t{s.qo_len} * group_size;
    max_kv_len = std::max<int64_t>(max_kv_len, s.kv_len);
  }
  // The kernel indexes packed rows and row offsets in 32 bits.
  if (total_packed_rows > kInt32Max) return std::nullopt;

  FlashInferPrefillPlan plan;
  const int64_t batch = static_cast<int64_t>(sequences.size());
  plan.batch = static_cast<int>(batch);
  plan.total_rows = static_cast<int>(total_rows);
  // FlashInfer sizes the tile by the average packed query length (its planner without CUDA graphs).
  plan.cta_tile_q = FlashInferPrefillCtaTileQ(total_packed_rows / batch, head_dim);
  // One chunk holds every key of any sequence: the kernel reads kv_chunk_size even without
  // split-KV (for an output stride it then ignores), so it must be a positive count.
  plan.kv_chunk_size = static_cast<int>(std::max<int64_t>(max_kv_len, 1));

  std::vector<int32_t> request_indices, qo_tile_indices;
  std::vector<int32_t> o_indptr = {0};
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t tiles = CeilDiv(int64_t{sequences[b].qo_len} * group_size, plan.cta_tile_q);
    for (int64_t tile = 0; tile < tiles; ++tile) {
      request_indices.push_back(static_cast<int32_t>(b));
      qo_tile_indices.push_back(static_cast<int32_t>(tile));
    }
    o_indptr.push_back(o_indptr.back() + sequences[b].qo_len);
  }
  plan.padded_batch_size = static_cast<int>(request_indices.size());

  const int tiles_span = AlignTo16Bytes(request_indices.size());
  plan.request_indices_offset = 0;
  plan.qo_tile_indices_offset = tiles_span;
  plan.kv_tile_indices_offset = 2 * tiles_span;
  plan.o_indptr_offset = 3 * tiles_span;
  plan.kv_chunk_size_offset = plan.o_indptr_offset + AlignTo16Bytes(o_indptr.size());
  plan.packed.assign(static_cast<size_t>(plan.kv_chunk_size_offset) + 1, 0);
  std::copy(request_indices.begin(), request_indices.end(),
            plan.packed.begin() + plan.request_indices_offset);
  std::copy(qo_tile_indices.begin(), qo_tile_indices.end(),
            plan.packed.begin() + plan.qo_tile_indices_offset);
  // kv_tile_indices stay 0: one KV chunk per block.
  std::copy(o_indptr.begin(), o_indptr.end(), plan.packed.begin() + plan.o_indptr_offset);
  plan.packed[plan.kv_chunk_size_offset] = plan.kv_chunk_size;
  return plan;
}

}  // namespace attnserve::cuda

// The host schedule of FlashInfer's batch prefill kernel over our pages (paged_prefill.h): which
// block serves which query tile of which sequence, packed into one int32 array the layer uploads
// as one section.
//
// Mirrors what FlashInfer's own planner (PrefillSplitQOKVIndptr in attention/scheduler.cuh,
// FlashInfer 0.5.3) writes with split-KV disabled, without calling it: it queries the device.
// FlashInfer packs a sequence's (token, group head) pairs into rows, row = token * group + g, and
// cuts them into tiles of cta_tile_q rows; one block serves one tile and one KV head (grid.z).
//
// No split-KV (partition_kv = false): each block reads every visible key of its sequence and
// writes the final output itself. Splitting long sequences would need a tmp buffer and FlashInfer's
// merge kernel per call; prefill chunks already give the grid many tiles, and the decode-through-
// prefill path (large GQA groups) has one block per KV head and sequence, as our own decode had
// before split-KV. Revisit with a benchmark on a device.
//
// Plain C++17 without absl or CUDA, so it has CPU unit tests (tests/gpu/flashinfer_prefill_plan_
// test.cc) and the layer's host code can include it.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_PREFILL_PLAN_H_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_PREFILL_PLAN_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace attnserve::cuda {

// One sequence of a prefill call.
struct FlashInferPrefillSequence {
  int qo_len = 0;  // New tokens (query rows) in this call, >= 0.
  // Keys the kernel sees: the tokens in the sequence's page list (leading pages a sliding window
  // evicted left out), the new ones included, so kv_len >= qo_len; the new tokens are the last
  // qo_len of them.
  int kv_len = 0;
};

// FlashInfer's FA2DetermineCtaTileQ for compute capability >= 8.0 (128 rows when the average
// packed query length exceeds 64, unless head_dim is 256; otherwise 64), limited to the tiles
// instantiated in paged_prefill_*.cu. FlashInfer would take 16 rows for at most 16 packed rows;
// that tile is not built (it would add half again to the FlashInfer build on CI's 2-core
// machine, docs/building.md), so such calls run on 64-row tiles, a quarter of them used: short
// chunks and decode through prefill with groups up to 16 (groups 1-8 decode on FlashInfer's
// decode kernel instead).
int FlashInferPrefillCtaTileQ(int64_t avg_packed_qo_len, int head_dim);

struct FlashInferPrefillPlan {
  int cta_tile_q = 0;         // Packed rows per block: 64 or 128.
  int padded_batch_size = 0;  // Blocks along grid.x: the (sequence, query tile) pairs.
  int batch = 0;
  int total_rows = 0;     // Query rows of the call: the sum of qo_len.
  int kv_chunk_size = 0;  // Keys per block: all of the longest sequence (no split-KV).

  // [request_indices | qo_tile_indices | kv_tile_indices] (padded_batch_size each) | o_indptr
  // (batch + 1) | kv_chunk_size (1), each array starting on a 16-byte boundary as in FlashInfer's
  // own workspace. o_indptr is the row offset of each sequence's first query row and output row:
  // the launch may pass it as q_indptr when q's rows are in sequence order.
  std::vector<int32_t> packed;
  int request_indices_offset = 0;  // Offsets into `packed`, in elements.
  int qo_tile_indices_offset = 0;
  int kv_tile_indices_offset = 0;
  int o_indptr_offset = 0;
  int kv_chunk_size_offset = 0;
};

// The schedule of one call, or nullopt for input FlashInfer cannot take: an empty batch, group or
// head_dim < 1, qo_len < 0, kv_len < qo_len, or rows or tiles beyond int32.
std::optional<FlashInferPrefillPlan> PlanFlashInferPrefill(
    const std::vector<FlashInferPrefillSequence>& sequences, int group_size, int head_dim);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_PREFILL_PLAN_H_

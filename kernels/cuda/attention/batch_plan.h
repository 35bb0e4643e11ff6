// The host plan of one CUDA layer call, built on the CPU before anything is uploaded (plan once,
// then run; STYLE habit 7): each row's RoPE position and sequence, the sequence descriptors, the
// batch's page table flattened to byte offsets, and the attention work items (prefill row chunks,
// or decode KV splits). CudaGqaLayer uploads it as is and launches from it, so the launch sequence
// holds no planning logic. How a call is cut into work items (the Plan* helpers below) is shared
// with the kernel tests, so both plan the same way.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_BATCH_PLAN_H_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_BATCH_PLAN_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/spec/decode_splits.h"

namespace attnserve::cuda {

// Prefill: the sequence's query rows, flattened as (token, group head) so the query heads of one
// KV group share a block (K/V read once for the group, never repeated), in chunks of
// `rows_per_block`. Each item reads the union of its rows' visible keys: masks are monotone in the
// query index, so that is [first row's begin, last row's end).
inline void PlanPrefillItems(const SequenceDesc& desc, int sequence_index, int group,
                             const MaskSpec& mask, int rows_per_block,
                             std::vector<WorkItem>& items) {
  const int flat_rows = desc.num_new * group;
  for (int r = 0; r < flat_rows; r += rows_per_block) {
    WorkItem item;
    item.sequence = sequence_index;
    item.row_begin = r;
    item.row_end = std::min(flat_rows, r + rows_per_block);
    int begin_lo, begin_hi, end_lo, end_hi;
    mask.VisibleKeys(desc.first_index + r / group, desc.length, &begin_lo, &begin_hi);
    mask.VisibleKeys(desc.first_index + (item.row_end - 1) / group, desc.length, &end_lo, &end_hi);
    item.key_begin = begin_lo;
    item.key_end = end_hi;
    items.push_back(item);
  }
}

// Decode: splits per sequence wanted so the grid (sequences x KV heads x row blocks x splits)
// fills about two waves over the SMs; PlanDecodeSplits caps it by kDecodeMinKeysPerSplit
// (kernels/spec/decode_splits.h, shared with the CPU decode).
inline int64_t DecodeSplitsForTwoWaves(int num_sequences, int num_kv_heads, int row_blocks,
                                       int multiprocessors) {
  const int64_t blocks_per_split = int64_t{num_sequences} * num_kv_heads * row_blocks;
  return std::max<int64_t>(
      1, (2 * int64_t{multiprocessors} + blocks_per_split - 1) / blocks_per_split);
}

// Decode: the new token's visible keys cut into `splits` nearly equal KV splits (flash-decoding);
// a sliding window's keys start at the window, so pages before it are never read.
inline void PlanDecodeSplits(const SequenceDesc& desc, int sequence_index, const MaskSpec& mask,
                             int64_t max_splits, int64_t min_keys_per_split,
                             std::vector<WorkItem>& items) {
  int key_begin, key_end;
  mask.VisibleKeys(desc.length - 1, desc.length, &key_begin, &key_end);
  const int64_t num_keys = key_end - key_begin;
  const int64_t splits = std::clamp<int64_t>(num_keys / min_keys_per_split, 1, max_splits);
  for (int64_t s = 0; s < splits; ++s) {
    WorkItem item;
    item.sequence = sequence_index;
    item.key_begin = static_cast<int>(key_begin + num_keys * s / splits);
    item.key_end = static_cast<int>(key_begin + num_keys * (s + 1) / splits);
    items.push_back(item);
  }
}

struct BatchPlan {
  std::vector<int64_t> positions;       // [rows] RoPE position of each row.
  std::vector<int> row_sequence;        // [rows] index in the batch of the row's sequence.
  std::vector<SequenceDesc> sequences;  // [batch]
  // [pages of all sequences, in batch order] byte offset of each page from the pool base, or -1
  // for a page a sliding window evicted; sequences[b].first_page indexes it.
  std::vector<int64_t> page_offsets;
  std::vector<WorkItem> items;  // One per attention block (grid.x).
  std::vector<int> item_begin;  // [batch + 1] first item of each sequence (decode's combine).
};

// What the plan depends on besides the batch.
struct BatchPlanShape {
  int group = 1;  // Query heads per KV head.
  int num_kv_heads = 1;
  int decode_row_blocks = 1;       // Decode: blocks of kAttentionRowsPerBlock rows per KV head.
  int prefill_rows_per_block = 1;  // Prefill: flattened (token, group head) rows per item.
  int multiprocessors = 1;         // Decode: splits are planned for about two waves over these.
  MaskSpec mask;
  // False when FlashInfer runs the attention: the native kernels' work items (and item_begin's
  // counts) are then left empty, saving their host work on every call.
  bool native_work_items = true;
};

// Plans a batch whose pages are reserved (`batch` from KvSequenceTable::Reserve; the tables count
// the new tokens). `positions`: empty (each row continues its sequence) or one per row.
// `page_offset` maps a page id to its byte offset in the pool. INVALID_ARGUMENT when a length
// does not fit the kernels' 32-bit indices.
absl::StatusOr<BatchPlan> PlanBatch(absl::Span<const BatchSequence> batch, int64_t rows,
                                    absl::Span<const int64_t> positions, bool decode,
                                    const BatchPlanShape& shape,
                                    absl::FunctionRef<int64_t(int32_t)> page_offset);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_BATCH_PLAN_H_

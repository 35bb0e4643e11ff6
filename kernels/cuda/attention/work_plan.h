// How an attention call is cut into thread blocks (work items), planned on the host. Shared by the
// CUDA layer and the kernel tests so both plan the same way.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_WORK_PLAN_H_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_WORK_PLAN_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/attention/params.h"
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

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_WORK_PLAN_H_

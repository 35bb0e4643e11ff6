// The host plan of one CUDA layer call, built on the CPU before anything is uploaded (plan once,
// then run; STYLE habit 7): each row's RoPE position and sequence, the sequence descriptors, the
// batch's page table flattened to byte offsets, and the attention work items (prefill row chunks,
// or decode KV splits; work_plan.h). CudaGqaLayer uploads it as is and launches from it, so the
// launch sequence holds no planning logic.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_BATCH_PLAN_H_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_BATCH_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/kv/sequence_table.h"

namespace attnserve::cuda {

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

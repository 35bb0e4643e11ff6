#include "kernels/cuda/attention/batch_plan.h"

#include <climits>

#include "absl/status/status.h"
#include "kernels/spec/decode_splits.h"
#include "kernels/kv/sequence_table.h"

namespace attnserve::cuda {

absl::StatusOr<BatchPlan> PlanBatch(absl::Span<const BatchSequence> batch, int64_t rows,
                                    absl::Span<const int64_t> positions, bool decode,
                                    const BatchPlanShape& shape,
                                    absl::FunctionRef<int64_t(int32_t)> page_offset) {
  const int num_seqs = static_cast<int>(batch.size());
  BatchPlan plan;
  plan.positions = ResolvePositions(batch, positions, rows);
  plan.row_sequence.resize(static_cast<size_t>(rows));
  const int64_t wanted_splits = DecodeSplitsForTwoWaves(
      num_seqs, shape.num_kv_heads, shape.decode_row_blocks, shape.multiprocessors);
  for (int b = 0; b < num_seqs; ++b) {
    const BatchSequence& seq = batch[b];
    const PageTable& table = *seq.table;
    if (table.num_tokens > INT_MAX) {
      return absl::InvalidArgumentError("sequence longer than 2^31 - 1 tokens");
    }
    SequenceDesc desc;
    desc.first_row = static_cast<int>(seq.first_row);
    desc.num_new = static_cast<int>(seq.num_new);
    desc.first_index = static_cast<int>(seq.first_index);
    desc.length = static_cast<int>(table.num_tokens);
    desc.first_page = static_cast<int>(plan.page_offsets.size());
    plan.sequences.push_back(desc);
    for (int32_t page : table.pages) {
      plan.page_offsets.push_back(page == kEvictedPage ? -1 : page_offset(page));
    }
    for (int64_t i = 0; i < seq.num_new; ++i) plan.row_sequence[seq.first_row + i] = b;
    plan.item_begin.push_back(static_cast<int>(plan.items.size()));
    if (!shape.native_work_items) continue;
    if (decode) {
      PlanDecodeSplits(desc, b, shape.mask, wanted_splits, kDecodeMinKeysPerSplit, plan.items);
    } else {
      PlanPrefillItems(desc, b, shape.group, shape.mask, shape.prefill_rows_per_block, plan.items);
    }
  }
  plan.item_begin.push_back(static_cast<int>(plan.items.size()));
  return plan;
}

}  // namespace attnserve::cuda

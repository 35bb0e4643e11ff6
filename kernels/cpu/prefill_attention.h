// Prefill attention: a chunk of new query tokens per sequence attends to the keys its mask
// allows, in key blocks gathered to float32 (a CPU flash-attention: an online softmax over blocks,
// never an L x L score matrix). Q·Kᵀ and P·V run in the register tiles of prefill_tiles.h
// (AVX-512 or AVX2, chosen at run time) when the head dims are multiples of 16, else as sgemm.
//
// Work items are (sequence, KV head, query block); rows of a query block are its tokens times the
// query heads of the KV head's group, so a GQA/MQA key block is loaded once per group.
#ifndef ATTNSERVE_KERNELS_CPU_PREFILL_ATTENTION_H_
#define ATTNSERVE_KERNELS_CPU_PREFILL_ATTENTION_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/spec/attention_variation.h"

namespace attnserve {

// Supplies one sequence's keys and values as float32 rows.
class KvBlockSource {
 public:
  virtual ~KvBlockSource() = default;
  // Writes keys [begin, end) of `kv_head` to keys[end - begin, key_dim] and their values to
  // values[end - begin, value_dim].
  virtual void Fill(int kv_head, int64_t begin, int64_t end, float* keys, float* values) const = 0;
};

struct PrefillAttentionParams {
  // Query token t (a row of the batch), query head h: q + t * q_row_stride + h * key_dim.
  const float* q = nullptr;
  int64_t q_row_stride = 0;
  // Its output: out + t * out_row_stride + h * value_dim.
  float* out = nullptr;
  int64_t out_row_stride = 0;
  int num_kv_heads = 0;
  int group_size = 0;  // Query heads per KV head; query head h belongs to KV head h / group_size.
  int key_dim = 0;
  int value_dim = 0;
  // Scale, mask, logits transform and softmax extra term (kernels/spec/attention_variation.h),
  // by query head; the sinks' extra term joins once, after a query block's last key block.
  AttentionVariation variation;
  // Keys and values of every (sequence, KV head) are converted to float32 once, before the query
  // blocks, when they take at most this many floats (128 MiB); larger problems (a short chunk over
  // a very long cached prefix) fill each key block per query block instead. Tests set 0 to run
  // that path.
  int64_t max_gathered_floats = int64_t{32} << 20;
};

struct PrefillSequence {
  int64_t first_row = 0;    // Batch row of this sequence's first new token.
  int64_t num_new = 0;      // New tokens (rows) of this sequence.
  int64_t first_index = 0;  // Index within the sequence of the first new token.
  int64_t length = 0;       // Tokens in the sequence including the new ones.
  const KvBlockSource* source = nullptr;
};

void PrefillAttention(const PrefillAttentionParams& params,
                      absl::Span<const PrefillSequence> sequences, ThreadPool& pool);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_PREFILL_ATTENTION_H_

// Paged decode attention (flash-decoding on the CPU): one new query token per sequence attends to
// that sequence's cached keys, read straight from its KV pages.
//
// Work is split into (sequence, KV head, key split) items. Each item reads its pages once and
// serves every query row of the KV head from them: the query heads of a GQA/MQA group, or all
// heads of an absorbed MLA layer (whose single "KV head" is the latent). Splits of one sequence
// produce partial softmax states (max, sum, unnormalised output) that a combine step merges, so a
// single long sequence still uses every thread; when every sequence is one item (a batch of at
// least twice the threads), each item normalises its own output and there is no combine step.
#ifndef ATTNSERVE_KERNELS_CPU_DECODE_ATTENTION_H_
#define ATTNSERVE_KERNELS_CPU_DECODE_ATTENTION_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/spec/attention_variation.h"

namespace attnserve {

struct DecodeAttentionParams {
  const float* q = nullptr;  // [batch, num_kv_heads, rows_per_kv_head, key_dim]
  float* out = nullptr;      // [batch, num_kv_heads, rows_per_kv_head, value_dim]
  int batch = 0;
  int num_kv_heads = 0;
  int rows_per_kv_head = 0;  // GQA group size; num_heads for absorbed MLA.
  int key_dim = 0;
  int value_dim = 0;
  // Scale, mask, logits transform and softmax extra term (kernels/spec/attention_variation.h).
  // Query row r of a KV head h is query head h * rows_per_kv_head + r for its hooks; the sinks'
  // extra term joins once, in the combine of the row's splits.
  AttentionVariation variation;
  KvPageLayout layout;
  const HostPageStore* store = nullptr;
  absl::Span<const PageTable* const> tables;  // [batch]; each holds the new token already.
};

void PagedDecodeAttention(const DecodeAttentionParams& params, ThreadPool& pool);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_DECODE_ATTENTION_H_

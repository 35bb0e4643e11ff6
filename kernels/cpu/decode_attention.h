// Paged decode attention (flash-decoding on the CPU): one new query token per sequence attends to
// that sequence's cached keys, read straight from its KV pages.
//
// Work is split into (sequence, KV head, key split) items. Each item reads its pages once and
// serves every query row of the KV head from them: the query heads of a GQA/MQA group, or all
// heads of an absorbed MLA layer (whose single "KV head" is the latent). Splits of one sequence
// produce partial softmax states (max, sum, unnormalised output) that a combine step merges, so a
// single long sequence still uses every thread.
#ifndef ATTNSERVE_KERNELS_CPU_DECODE_ATTENTION_H_
#define ATTNSERVE_KERNELS_CPU_DECODE_ATTENTION_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kernels/cpu/attention_policy.h"
#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv/page_table.h"

namespace attnserve {

struct DecodeAttentionParams {
  const float* q = nullptr;  // [batch, num_kv_heads, rows_per_kv_head, key_dim]
  float* out = nullptr;      // [batch, num_kv_heads, rows_per_kv_head, value_dim]
  int batch = 0;
  int num_kv_heads = 0;
  int rows_per_kv_head = 0;  // GQA group size; num_heads for absorbed MLA.
  int key_dim = 0;
  int value_dim = 0;
  float scale = 1.0f;  // Multiplies q.k before the softmax.
  MaskPolicy mask;
  float softcap = 0.0f;  // 0 = none; else scaled scores s become softcap * tanh(s / softcap).
  // Optional [num_kv_heads * rows_per_kv_head]: each query row's extra softmax logit (gpt-oss
  // sinks), joined once in the combine of the row's splits and dropped after it.
  const float* sinks = nullptr;
  KvPageLayout layout;
  const HostPageStore* store = nullptr;
  absl::Span<const PageTable* const> tables;  // [batch]; each holds the new token already.
};

void PagedDecodeAttention(const DecodeAttentionParams& params, ThreadPool& pool);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_DECODE_ATTENTION_H_

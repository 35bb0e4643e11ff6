// Split-KV combine, flash-decoding's second step: merges the partial softmax states that
// PagedDecodeBlock (paged_attention.cuh) wrote for each KV split of a sequence. Written against
// simt.h, so the same source also runs on the CPU block emulator in CI
// (tests/gpu/attention_emulation_test.cc); combine.cu holds the kernel and its launcher.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_COMBINE_CUH_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_COMBINE_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/variant_hooks.cuh"
#include "kernels/cuda/simt/simt.h"

namespace attnserve::cuda {

// Block (b, h) of grid (batch, num_heads), block head_dim (= p.kv.head_dim) threads: thread d
// merges element d of head h's splits of sequence b (items [item_begin[b], item_begin[b + 1])).
//   out = sum_i exp(m_i - M) acc_i / (sum_i exp(m_i - M) l_i + exp(sink - M)),
//   M = max(max_i m_i, sink); the sink term (JoinSink) is 0 and absent from M without sinks.
ATTNSERVE_SIMT void CombineSplitsBlock(const AttentionParams& p, int b, int h) {
  const int d = simt::ThreadIndex();
  const int head_dim = p.kv.head_dim;
  const int begin = p.item_begin[b], end = p.item_begin[b + 1];
  float global_max = -INFINITY;
  for (int i = begin; i < end; ++i) {
    global_max = fmaxf(global_max, p.partial_max[int64_t{i} * p.num_heads + h]);
  }
  float total = JoinSink(p.variant, h, &global_max), acc = 0.0f;
  for (int i = begin; i < end; ++i) {
    const int64_t row = int64_t{i} * p.num_heads + h;
    const float sum = p.partial_sum[row];
    if (sum == 0.0f) continue;  // A split that saw no key (cannot happen with a correct plan).
    const float weight = expf(p.partial_max[row] - global_max);
    total += weight * sum;
    acc += weight * p.partial_acc[row * head_dim + d];
  }
  const int64_t out_row = p.sequences[b].first_row;
  p.out[(out_row * p.num_heads + h) * head_dim + d] = total > 0.0f ? acc / total : 0.0f;
}

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_COMBINE_CUH_

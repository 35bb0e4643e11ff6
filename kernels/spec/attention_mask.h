// The one rule for which keys a query may see, shared by the CPU backend (KeyWindow,
// kernels/spec/attention_variation.h, 64-bit indices) and the CUDA kernels and their host planner
// (MaskSpec, kernels/cuda/attention/params.h, 32-bit indices). nvcc-safe: no absl, no std headers.
//
// Causal with a Mistral sliding window W: the query at index i sees keys j with i - W < j <= i
// (W = 0: all j <= i). Non-causal: every key of the sequence, including those after the query.
// Indices are a token's index in its sequence (transformers' cache_position), never its RoPE
// position.
#ifndef ATTNSERVE_KERNELS_SPEC_ATTENTION_MASK_H_
#define ATTNSERVE_KERNELS_SPEC_ATTENTION_MASK_H_

#include "kernels/core/host_device.h"

namespace attnserve {

// Half-open [*begin, *end) of the keys visible to query index `query` of a sequence that holds
// `length` tokens.
template <typename Index>
ATTNSERVE_HD inline void VisibleKeyRange(bool causal, Index window, Index query, Index length,
                                         Index* begin, Index* end) {
  if (!causal) {
    *begin = 0;
    *end = length;
    return;
  }
  *begin = (window > 0 && query - window + 1 > 0) ? query - window + 1 : 0;
  *end = query + 1;
}

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_SPEC_ATTENTION_MASK_H_

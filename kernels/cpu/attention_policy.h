// Small value types that describe an attention problem without touching its data: which keys a
// query may see (the mask policy) and where a KV head's rows sit inside a page (the page layout).
// Kernels take these instead of branching on variants in their loops.
#ifndef ATTNSERVE_KERNELS_CPU_ATTENTION_POLICY_H_
#define ATTNSERVE_KERNELS_CPU_ATTENTION_POLICY_H_

#include <algorithm>
#include <cstdint>

#include "kernels/attention_mask.h"
#include "kernels/dtype.h"
#include "kernels/kv_page_layout.h"
#include "kernels/layer_spec.h"

namespace attnserve {

// Half-open range of key indices [begin, end) within a sequence.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// The mask rule (kernels/attention_mask.h) with the spec's parameters.
struct MaskPolicy {
  bool causal = true;
  int64_t window = 0;  // Sliding window in tokens; 0 = unlimited.

  static MaskPolicy FromSpec(const LayerSpec& spec) { return {spec.causal, spec.sliding_window}; }

  // Keys visible to the query at index `query` of a sequence that holds `length` tokens.
  KeyRange VisibleKeys(int64_t query, int64_t length) const {
    KeyRange keys;
    VisibleKeyRange<int64_t>(causal, window, query, length, &keys.begin, &keys.end);
    return keys;
  }
};

// Element offsets of a KV head's rows within one page; every page of a layer has the same layout,
// the one kernels/kv_page_layout.h defines for both backends (Gqa/MlaLayer::MakePageLayout):
//   MHA/MQA/GQA page: [K|V][num_kv_heads][page_size][head_dim]
//   MLA page:         [page_size][kv_lora_rank + qk_rope_head_dim]  (latent, then RoPE key)
struct KvPageLayout {
  int page_size = 0;          // Tokens per page.
  DType dtype = DType::kF32;  // Element type in the page.
  int64_t row_stride = 0;     // Elements between the rows of consecutive slots.
  int64_t head_stride = 0;    // Elements between consecutive KV heads' first rows (0: one head).
  int64_t key_offset = 0;     // Elements from the page start to KV head 0's key in slot 0.
  int64_t value_offset = 0;   // Elements from the page start to KV head 0's value in slot 0.
  int64_t page_elements = 0;  // Elements per page.

  int64_t KeyElement(int head, int slot) const {
    return key_offset + head * head_stride + slot * row_stride;
  }
  int64_t ValueElement(int head, int slot) const {
    return value_offset + head * head_stride + slot * row_stride;
  }
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_ATTENTION_POLICY_H_

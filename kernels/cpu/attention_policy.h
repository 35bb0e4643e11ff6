// Small value types that describe an attention problem without touching its data: where a KV
// head's rows sit inside a page (the page layout). Which keys a query may see and every other
// variation are the hooks of kernels/spec/attention_variation.h.
#ifndef ATTNSERVE_KERNELS_CPU_ATTENTION_POLICY_H_
#define ATTNSERVE_KERNELS_CPU_ATTENTION_POLICY_H_

#include <cstdint>

#include "kernels/core/dtype.h"
#include "kernels/kv/page_layout.h"
#include "kernels/kv/storage_format.h"
#include "kernels/spec/attention_variation.h"

namespace attnserve {

// Element offsets of a KV head's rows within one page; every page of a layer has the same layout,
// the one kernels/kv/page_layout.h defines for both backends (Gqa/MlaLayer::MakePageLayout):
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
  // 8-bit pages (kernels/kv/quantization.h): 1-byte codes (`dtype` is then unused) and float32
  // scales from byte `scales_offset` on. A row's scale is scales[ScaleIndex(head, value)]; when
  // `split_column` > 0, its columns from there on use the next scale (MLA's RoPE key).
  KvQuantization quantization = KvQuantization::kNone;
  int64_t scales_offset = 0;  // Bytes from the page start to scale 0.
  int scale_count = 0;        // Scales per page.
  int value_scales = 0;       // Index of KV head 0's value scale (MLA: 0, the value is the latent).
  int split_column = 0;

  bool quantized() const { return quantization != KvQuantization::kNone; }
  int64_t ElementBytes() const { return quantized() ? 1 : static_cast<int64_t>(DTypeSize(dtype)); }
  int ScaleIndex(int head, bool value) const {
    return (value ? value_scales : 0) + head * (split_column > 0 ? 2 : 1);
  }

  int64_t KeyElement(int head, int slot) const {
    return key_offset + head * head_stride + slot * row_stride;
  }
  int64_t ValueElement(int head, int slot) const {
    return value_offset + head * head_stride + slot * row_stride;
  }
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_ATTENTION_POLICY_H_

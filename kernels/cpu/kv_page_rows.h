// Reading and writing one cached row (a KV head's key or value of one token, or an MLA latent
// row) of a KV page in the page's storage format: f32/bf16 rows are converted element by element;
// 8-bit rows are quantized with the page's own scales (kernels/kv/quantization.h: the scale is set
// by the row in slot 0 and grows, requantizing the rows before it, when a later row needs more)
// and dequantized to float32 when read. Rows of a page must be written in slot order, as
// sequences append them.
#ifndef ATTNSERVE_KERNELS_CPU_KV_PAGE_ROWS_H_
#define ATTNSERVE_KERNELS_CPU_KV_PAGE_ROWS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/attention_policy.h"

namespace attnserve {

// Writes `count` floats as the key (`value` false) or value row of (KV head `head`, `slot`).
void WritePageRow(const KvPageLayout& layout, std::byte* page, int head, bool value, int slot,
                  const float* src, int64_t count);

// Reads `count` elements of that row as float32.
void ReadPageRow(const KvPageLayout& layout, const std::byte* page, int head, bool value, int slot,
                 int64_t count, float* dst);

// 8-bit pages, for decode: dequantizes the key rows (`key_dim` wide) and value rows (`value_dim`
// wide; none apart when values live inside the key rows, as MLA's) of slots [first_slot, end_slot)
// of every KV head into `out`, a float32 page with the same element offsets as `layout`.
void DequantizePageRows(const KvPageLayout& layout, const std::byte* page, int num_kv_heads,
                        int key_dim, int value_dim, int first_slot, int end_slot, float* out);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_KV_PAGE_ROWS_H_

// The CPU backend's KV pages: host memory behind them, where a KV head's rows sit inside a page
// (KvPageLayout), and reading and writing one cached row in the page's storage format. Pages are
// fixed-size byte blocks addressed by id; memory is committed in slabs as ids are first used, so a
// pool sized for the worst case costs only what its sequences hold (ids are handed out lowest
// first, keeping the touched slabs few).
//
// Rows (a KV head's key or value of one token, or an MLA latent row): f32/bf16 rows are converted
// element by element; 8-bit rows are quantized with the page's own scales
// (kernels/kv/quantization.h: the scale is set by the row in slot 0 and grows, requantizing the
// rows before it, when a later row needs more) and dequantized to float32 when read. Rows of a
// page must be written in slot order, as sequences append them. Which keys a query may see and
// every other variation are the hooks of kernels/spec/attention_variation.h.
#ifndef ATTNSERVE_KERNELS_CPU_HOST_PAGE_STORE_H_
#define ATTNSERVE_KERNELS_CPU_HOST_PAGE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/core/tensor.h"
#include "kernels/kv/page_layout.h"
#include "kernels/kv/storage_format.h"

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

class HostPageStore {
 public:
  explicit HostPageStore(int64_t page_bytes);

  // Commits memory for `pages` if not yet committed. RESOURCE_EXHAUSTED when the host refuses.
  absl::Status Commit(absl::Span<const int32_t> pages);

  std::byte* page(int32_t id) {
    return slabs_[id / kPagesPerSlab].get() + (id % kPagesPerSlab) * page_bytes_;
  }
  const std::byte* page(int32_t id) const {
    return slabs_[id / kPagesPerSlab].get() + (id % kPagesPerSlab) * page_bytes_;
  }
  int64_t page_bytes() const { return page_bytes_; }
  int64_t committed_bytes() const { return committed_slabs_ * kPagesPerSlab * page_bytes_; }

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  static constexpr int64_t kPagesPerSlab = 64;
  int64_t page_bytes_;
  int64_t committed_slabs_ = 0;
  std::vector<std::unique_ptr<std::byte[], FreeDeleter>> slabs_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_HOST_PAGE_STORE_H_

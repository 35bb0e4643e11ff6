// A KvBlockSource over a sequence's KV pages (MHA/MQA/GQA prefill): gathers key and value rows
// from the pages as float32 (widened from bf16, or dequantized from 8-bit codes).
#ifndef ATTNSERVE_KERNELS_CPU_PAGED_KV_SOURCE_H_
#define ATTNSERVE_KERNELS_CPU_PAGED_KV_SOURCE_H_

#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/spec/attention_variation.h"

namespace attnserve {

class PagedKvSource : public KvBlockSource {
 public:
  PagedKvSource(const PageTable* table, const HostPageStore* store, const KvPageLayout* layout,
                int key_dim, int value_dim)
      : table_(table), store_(store), layout_(layout), key_dim_(key_dim), value_dim_(value_dim) {}

  void Fill(int kv_head, int64_t begin, int64_t end, float* keys, float* values) const override {
    for (int64_t index = begin; index < end; ++index) {
      const std::byte* page = store_->page(table_->PageOf(index, layout_->page_size));
      const int slot = static_cast<int>(index % layout_->page_size);
      ReadPageRow(*layout_, page, kv_head, /*value=*/false, slot, key_dim_,
                  keys + (index - begin) * key_dim_);
      ReadPageRow(*layout_, page, kv_head, /*value=*/true, slot, value_dim_,
                  values + (index - begin) * value_dim_);
    }
  }

 private:
  const PageTable* table_;
  const HostPageStore* store_;
  const KvPageLayout* layout_;
  int key_dim_;
  int value_dim_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_PAGED_KV_SOURCE_H_

// A KvBlockSource over a sequence's KV pages (MHA/MQA/GQA prefill): gathers key and value rows
// from the pages, widening the page dtype to float32.
#ifndef ATTNSERVE_KERNELS_CPU_PAGED_KV_SOURCE_H_
#define ATTNSERVE_KERNELS_CPU_PAGED_KV_SOURCE_H_

#include "kernels/cpu/attention_policy.h"
#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/page_table.h"

namespace attnserve {

class PagedKvSource : public KvBlockSource {
 public:
  PagedKvSource(const PageTable* table, const HostPageStore* store, const KvPageLayout* layout,
                int key_dim, int value_dim)
      : table_(table), store_(store), layout_(layout), key_dim_(key_dim), value_dim_(value_dim) {}

  void Fill(int kv_head, int64_t begin, int64_t end, float* keys, float* values) const override {
    const size_t element_bytes = DTypeSize(layout_->dtype);
    for (int64_t index = begin; index < end; ++index) {
      const std::byte* page = store_->page(table_->PageOf(index, layout_->page_size));
      const int slot = static_cast<int>(index % layout_->page_size);
      ConvertToFloat(layout_->dtype, page + layout_->KeyElement(kv_head, slot) * element_bytes,
                     keys + (index - begin) * key_dim_, key_dim_);
      ConvertToFloat(layout_->dtype, page + layout_->ValueElement(kv_head, slot) * element_bytes,
                     values + (index - begin) * value_dim_, value_dim_);
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

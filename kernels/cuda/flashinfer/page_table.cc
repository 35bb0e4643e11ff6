#include "kernels/cuda/flashinfer/page_table.h"

#include <cstdint>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve::cuda {

int64_t FlashInferPageUnitBytes(int64_t page_bytes, int64_t slab_bytes) {
  return std::gcd(page_bytes, slab_bytes);
}

absl::StatusOr<FlashInferPageTable> BuildFlashInferPageTable(
    absl::Span<const SequenceDesc> sequences, absl::Span<const int64_t> page_offsets,
    int page_size, int64_t unit_bytes) {
  FlashInferPageTable table;
  table.indptr.push_back(0);
  table.q_indptr.push_back(0);
  for (size_t b = 0; b < sequences.size(); ++b) {
    const SequenceDesc& seq = sequences[b];
    const int num_pages = (seq.length + page_size - 1) / page_size;
    int dropped = 0;
    for (int p = 0; p < num_pages; ++p) {
      const int64_t offset = page_offsets[static_cast<size_t>(seq.first_page) + p];
      if (offset < 0) {
        if (static_cast<int>(table.page_indices.size()) != table.indptr.back()) {
          return absl::InternalError(absl::StrCat("sequence ", b, ": page ", p,
                                                  " is evicted but follows a kept page"));
        }
        ++dropped;
        continue;
      }
      if (offset % unit_bytes != 0) {
        return absl::InternalError(absl::StrCat("page offset ", offset,
                                                " is not a multiple of the unit ", unit_bytes));
      }
      const int64_t index = offset / unit_bytes;
      if (index > INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat("page index ", index, " does not fit FlashInfer's 32-bit page indices"));
      }
      table.page_indices.push_back(static_cast<int32_t>(index));
    }
    if (dropped == num_pages) {
      return absl::InternalError(absl::StrCat("sequence ", b, ": every page is evicted"));
    }
    table.indptr.push_back(static_cast<int32_t>(table.page_indices.size()));
    table.last_page_len.push_back(seq.length - (num_pages - 1) * page_size);
    table.kv_len.push_back(seq.length - dropped * page_size);
    table.kv_pages.push_back(num_pages - dropped);
    table.q_indptr.push_back(table.q_indptr.back() + seq.num_new);
  }
  return table;
}

}  // namespace attnserve::cuda

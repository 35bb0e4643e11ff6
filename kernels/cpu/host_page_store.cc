#include "kernels/cpu/host_page_store.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/kv/quantization.h"

namespace attnserve {

HostPageStore::HostPageStore(int64_t page_bytes) : page_bytes_(page_bytes) {}

absl::Status HostPageStore::Commit(absl::Span<const int32_t> pages) {
  for (int32_t id : pages) {
    // The slab table grows with the highest id used, not with the capacity.
    const size_t slab_index = static_cast<size_t>(id / kPagesPerSlab);
    if (slab_index >= slabs_.size()) slabs_.resize(slab_index + 1);
    auto& slab = slabs_[slab_index];
    if (slab != nullptr) continue;
    // 64-byte alignment keeps rows of K/V on cache-line boundaries for the SIMD loops.
    const int64_t bytes = (kPagesPerSlab * page_bytes_ + 63) / 64 * 64;
    slab.reset(static_cast<std::byte*>(std::aligned_alloc(64, static_cast<size_t>(bytes))));
    if (slab == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host refused ", bytes, " bytes for KV pages"));
    }
    ++committed_slabs_;
  }
  return absl::OkStatus();
}

namespace {

int64_t RowElement(const KvPageLayout& layout, int head, bool value, int slot) {
  return value ? layout.ValueElement(head, slot) : layout.KeyElement(head, slot);
}

// The columns of a row that share one scale: [begin, end) uses scales[index].
struct ScaleSegment {
  int64_t begin;
  int64_t end;
  int index;
};

// One segment, or two when the row crosses the layout's split column (MLA: latent | RoPE key).
int RowSegments(const KvPageLayout& layout, int head, bool value, int64_t count,
                ScaleSegment segments[2]) {
  const int index = layout.ScaleIndex(head, value);
  if (layout.split_column > 0 && layout.split_column < count) {
    segments[0] = {0, layout.split_column, index};
    segments[1] = {layout.split_column, count, index + 1};
    return 2;
  }
  segments[0] = {0, count, index};
  return 1;
}

float* Scales(const KvPageLayout& layout, std::byte* page) {
  return reinterpret_cast<float*>(page + layout.scales_offset);
}
const float* Scales(const KvPageLayout& layout, const std::byte* page) {
  return reinterpret_cast<const float*>(page + layout.scales_offset);
}

}  // namespace

void WritePageRow(const KvPageLayout& layout, std::byte* page, int head, bool value, int slot,
                  const float* src, int64_t count) {
  const int64_t element = RowElement(layout, head, value, slot);
  if (!layout.quantized()) {
    ConvertFromFloat(src, layout.dtype, page + element * layout.ElementBytes(),
                     static_cast<size_t>(count));
    return;
  }
  auto* codes = reinterpret_cast<uint8_t*>(page);
  float* scales = Scales(layout, page);
  ScaleSegment segments[2];
  const int num_segments = RowSegments(layout, head, value, count, segments);
  for (int k = 0; k < num_segments; ++k) {
    const ScaleSegment& segment = segments[k];
    const int64_t width = segment.end - segment.begin;
    const float needed = KvScaleFor(layout.quantization, FiniteAbsMax(src + segment.begin, width));
    float& scale = scales[segment.index];
    if (slot == 0) {
      scale = needed;  // The page's first row: whatever the reused page held before is stale.
    } else if (needed > scale) {
      for (int earlier = 0; earlier < slot; ++earlier) {
        RescaleKvCodes(layout.quantization,
                       codes + RowElement(layout, head, value, earlier) + segment.begin, width,
                       scale, needed);
      }
      scale = needed;
    }
    QuantizeKvRow(layout.quantization, src + segment.begin, width, scale,
                  codes + element + segment.begin);
  }
}

void ReadPageRow(const KvPageLayout& layout, const std::byte* page, int head, bool value, int slot,
                 int64_t count, float* dst) {
  const int64_t element = RowElement(layout, head, value, slot);
  if (!layout.quantized()) {
    ConvertToFloat(layout.dtype, page + element * layout.ElementBytes(), dst,
                   static_cast<size_t>(count));
    return;
  }
  const auto* codes = reinterpret_cast<const uint8_t*>(page) + element;
  const float* scales = Scales(layout, page);
  ScaleSegment segments[2];
  const int num_segments = RowSegments(layout, head, value, count, segments);
  for (int k = 0; k < num_segments; ++k) {
    const ScaleSegment& segment = segments[k];
    DequantizeKvRow(layout.quantization, codes + segment.begin, segment.end - segment.begin,
                    scales[segment.index], dst + segment.begin);
  }
}

void DequantizePageRows(const KvPageLayout& layout, const std::byte* page, int num_kv_heads,
                        int key_dim, int value_dim, int first_slot, int end_slot, float* out) {
  const bool separate_values = layout.value_offset != layout.key_offset;
  for (int head = 0; head < num_kv_heads; ++head) {
    for (int slot = first_slot; slot < end_slot; ++slot) {
      ReadPageRow(layout, page, head, /*value=*/false, slot, key_dim,
                  out + layout.KeyElement(head, slot));
      if (separate_values) {
        ReadPageRow(layout, page, head, /*value=*/true, slot, value_dim,
                    out + layout.ValueElement(head, slot));
      }
    }
  }
}

}  // namespace attnserve

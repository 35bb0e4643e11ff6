// Where one CUDA layer call's buffers sit. A call's device workspace is a row of 256-byte aligned
// sections (so every kernel's vector loads are aligned), laid out afresh per call on the layer's
// reusable workspace and pinned staging buffers (no allocation once they are large enough). Both
// layer kinds start it with the same upload region, the input in the caller's dtype and the host
// plan, written into pinned staging and copied to the device in one go, and end it with the same
// output sections, downloaded once in the caller's dtype.
#ifndef ATTNSERVE_KERNELS_CUDA_LAYER_CALL_LAYOUT_H_
#define ATTNSERVE_KERNELS_CUDA_LAYER_CALL_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "kernels/core/tensor.h"
#include "kernels/cuda/attention/batch_plan.h"

namespace attnserve::cuda {

inline constexpr size_t kSectionAlign = 256;

inline size_t AlignUp(size_t bytes) {
  return (bytes + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
}

// Byte offset and size of one buffer in the workspace (and, for the upload region, in staging).
struct Section {
  size_t offset = 0;
  size_t bytes = 0;
};

// Hands out consecutive aligned sections.
class SectionLayout {
 public:
  Section Add(size_t bytes) {
    Section s{total_, bytes};
    total_ += AlignUp(bytes);
    return s;
  }
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

// The upload region, at offset 0 of both the workspace and the staging buffer.
struct UploadSections {
  Section x;                 // [rows, d_model] the input, in the wire dtype.
  Section positions;         // [rows] int64
  Section row_sequence;      // [rows] int
  Section sequences;         // [batch] SequenceDesc
  Section pages;             // [pages] int64 byte offsets (at least one slot)
  Section items;             // [items] WorkItem, the native kernels' (empty under FlashInfer).
  Section item_begin;        // [batch + 1] int, the decode combine's (empty under FlashInfer).
  Section flashinfer_words;  // FlashInfer's packed schedule (empty without it).
  size_t bytes = 0;          // The whole region: one host-to-device copy.

  // Lays the region out at the start of `layout`, which must be empty.
  static UploadSections LayOut(const BatchPlan& plan, int64_t rows, int d_model, DType wire,
                               size_t num_flashinfer_words, SectionLayout& layout);
  // Writes the input (its bytes as they are: the device converts) and the plan into `host`, the
  // pinned staging buffer of at least `bytes`.
  void Write(const Tensor& hidden, const BatchPlan& plan,
             absl::Span<const int32_t> flashinfer_words, std::byte* host) const;
};

// The output end of a call: the fp32 result, its copy in a 16-bit wire dtype, and the finiteness
// flag; downloaded into staging right after the upload region.
struct OutputSections {
  Section out;        // [rows, d_model] fp32, what the output projection writes.
  Section out_wire;   // [rows, d_model] in a 16-bit wire dtype; empty when it is fp32.
  Section first_bad;  // unsigned long long: first element not finite in the wire dtype, or ~0.
  DType wire = DType::kF32;

  static OutputSections LayOut(int64_t rows, int d_model, DType wire, SectionLayout& layout);
  const Section& download() const { return wire == DType::kF32 ? out : out_wire; }
  // Staging bytes after the upload region: the downloaded output, then the flag.
  size_t staging_bytes() const { return AlignUp(download().bytes) + sizeof(unsigned long long); }
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LAYER_CALL_LAYOUT_H_

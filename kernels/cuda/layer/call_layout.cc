#include "kernels/cuda/layer/call_layout.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/attention/params.h"

namespace attnserve::cuda {

UploadSections UploadSections::LayOut(const BatchPlan& plan, int64_t rows, int d_model, DType wire,
                                      size_t num_flashinfer_words, SectionLayout& layout) {
  UploadSections up;
  up.x = layout.Add(DTypeSize(wire) * rows * d_model);
  up.positions = layout.Add(sizeof(int64_t) * rows);
  up.row_sequence = layout.Add(sizeof(int) * rows);
  up.sequences = layout.Add(sizeof(SequenceDesc) * plan.sequences.size());
  up.pages = layout.Add(sizeof(int64_t) * std::max<size_t>(1, plan.page_offsets.size()));
  up.items = layout.Add(sizeof(WorkItem) * plan.items.size());
  up.item_begin = layout.Add(sizeof(int) * plan.item_begin.size());
  up.flashinfer_words = layout.Add(sizeof(int32_t) * num_flashinfer_words);
  up.bytes = layout.total();
  return up;
}

void UploadSections::Write(const Tensor& hidden, const BatchPlan& plan,
                           absl::Span<const int32_t> flashinfer_words, std::byte* host) const {
  auto put = [&](const Section& section, const void* src) {
    if (section.bytes > 0) std::memcpy(host + section.offset, src, section.bytes);
  };
  put(x, hidden.data());
  put(positions, plan.positions.data());
  put(row_sequence, plan.row_sequence.data());
  put(sequences, plan.sequences.data());
  if (!plan.page_offsets.empty()) put(pages, plan.page_offsets.data());
  put(items, plan.items.data());
  put(item_begin, plan.item_begin.data());
  put(this->flashinfer_words, flashinfer_words.data());
}

OutputSections OutputSections::LayOut(int64_t rows, int d_model, DType wire,
                                      SectionLayout& layout) {
  OutputSections o;
  o.wire = wire;
  o.out = layout.Add(sizeof(float) * rows * d_model);
  o.out_wire = layout.Add(wire == DType::kF32 ? 0 : DTypeSize(wire) * rows * d_model);
  o.first_bad = layout.Add(sizeof(unsigned long long));
  return o;
}

}  // namespace attnserve::cuda

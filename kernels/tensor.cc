#include "kernels/tensor.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve {

namespace {
int64_t Product(absl::Span<const int64_t> shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}
}  // namespace

Tensor::Tensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype),
      shape_(std::move(shape)),
      bytes_(static_cast<size_t>(Product(shape_)) * DTypeSize(dtype)) {}

Tensor Tensor::FromFloats(std::vector<int64_t> shape, absl::Span<const float> values) {
  Tensor tensor(DType::kF32, std::move(shape));
  const size_t bytes = std::min(tensor.num_bytes(), values.size() * sizeof(float));
  if (bytes > 0) std::memcpy(tensor.data(), values.data(), bytes);  // data() may be null if empty.
  return tensor;
}

int64_t Tensor::num_elements() const { return Product(shape_); }

std::vector<float> Tensor::ToFloats() const {
  std::vector<float> values(static_cast<size_t>(num_elements()));
  ConvertToFloat(dtype_, bytes_.data(), values.data(), values.size());
  return values;
}

Tensor Tensor::CastTo(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out(dtype, shape_);
  const std::vector<float> values = ToFloats();
  ConvertFromFloat(values.data(), dtype, out.data(), values.size());
  return out;
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), ShapeString(shape_));
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status CheckShape(const Tensor& tensor, absl::Span<const int64_t> expected,
                        absl::string_view what) {
  if (absl::Span<const int64_t>(tensor.shape()) == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " has shape ", ShapeString(tensor.shape()),
                                                 ", expected ", ShapeString(expected)));
}

}  // namespace attnserve

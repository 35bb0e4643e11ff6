#include "kernels/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve {

namespace {
// An empty dimension anywhere makes the tensor empty, whatever the others: checked first, so the
// other dimensions (which callers bound only for non-empty tensors, e.g. the .npy reader) are never
// multiplied together. The fuzzer's (1, 41, 40, 81, 40, 8, 6840, ..., 0, 8) overflowed here.
int64_t Product(absl::Span<const int64_t> shape) {
  if (absl::c_linear_search(shape, int64_t{0})) return 0;
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

// Index of the first element whose exponent bits are all ones (NaN or +-Inf), or -1.
template <typename Bits>
int64_t FirstAllOnesExponent(const std::byte* data, int64_t count, Bits exponent_mask) {
  for (int64_t i = 0; i < count; ++i) {
    Bits bits;
    std::memcpy(&bits, data + i * static_cast<int64_t>(sizeof(Bits)), sizeof(Bits));
    if ((bits & exponent_mask) == exponent_mask) return i;
  }
  return -1;
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

int64_t FirstNonFiniteElement(const Tensor& tensor) {
  const int64_t count = tensor.num_elements();
  switch (tensor.dtype()) {
    case DType::kF32:
      return FirstAllOnesExponent<uint32_t>(tensor.data(), count, 0x7f800000u);
    case DType::kF16:
      return FirstAllOnesExponent<uint16_t>(tensor.data(), count, 0x7c00u);
    case DType::kBF16:
      return FirstAllOnesExponent<uint16_t>(tensor.data(), count, 0x7f80u);
  }
  return -1;
}

float MaxAbsValue(const Tensor& tensor) {
  constexpr int64_t kBlock = 4096;  // Converted a block at a time: no full fp32 copy.
  float values[kBlock];
  float max_abs = 0.0f;
  const int64_t count = tensor.num_elements();
  const size_t element_bytes = DTypeSize(tensor.dtype());
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    ConvertToFloat(tensor.dtype(), tensor.data() + begin * static_cast<int64_t>(element_bytes),
                   values, static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) max_abs = std::max(max_abs, std::abs(values[i]));
  }
  return max_abs;
}

}  // namespace attnserve

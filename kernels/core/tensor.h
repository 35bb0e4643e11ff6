// A host tensor: dtype, shape and a dense row-major byte buffer that it owns.
//
// This is the currency of the backend interface (inputs, outputs, weights). It is deliberately
// small: no strides, no views, no device memory. Backends copy to their own memory as needed.
#ifndef ATTNSERVE_KERNELS_CORE_TENSOR_H_
#define ATTNSERVE_KERNELS_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/core/dtype.h"

namespace attnserve {

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor of the given dtype and shape.
  Tensor(DType dtype, std::vector<int64_t> shape);

  // A float32 tensor holding a copy of `values`; `values.size()` must equal the shape's product.
  static Tensor FromFloats(std::vector<int64_t> shape, absl::Span<const float> values);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int axis) const { return shape_[axis]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t num_elements() const;
  size_t num_bytes() const { return bytes_.size(); }

  std::byte* data() { return bytes_.data(); }
  const std::byte* data() const { return bytes_.data(); }
  // Typed access; only valid when dtype() == kF32.
  float* f32() { return reinterpret_cast<float*>(bytes_.data()); }
  const float* f32() const { return reinterpret_cast<const float*>(bytes_.data()); }

  // Returns this tensor's values converted to float32 (a copy).
  std::vector<float> ToFloats() const;
  // Returns a copy converted to `dtype` (round to nearest even).
  Tensor CastTo(DType dtype) const;

  // "bf16[3, 512]"
  std::string DebugString() const;

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  std::vector<std::byte> bytes_;
};

// "[3, 512]"
std::string ShapeString(absl::Span<const int64_t> shape);

// Row-major index of the first element that is NaN or infinite, or -1 when every element is
// finite. Reads the exponent bits, so it is exact for every dtype and never converts.
int64_t FirstNonFiniteElement(const Tensor& tensor);

// The largest |x| over the tensor's elements (0 when empty). Meaningful for finite tensors only.
float MaxAbsValue(const Tensor& tensor);

// OK when `tensor` has exactly `expected` as its shape; otherwise INVALID_ARGUMENT naming `what`
// and both shapes.
absl::Status CheckShape(const Tensor& tensor, absl::Span<const int64_t> expected,
                        absl::string_view what);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CORE_TENSOR_H_

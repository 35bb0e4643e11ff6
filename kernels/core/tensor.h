// The currency of the backend interface: the element types that cross it, their scalar
// conversions, and the host tensor (inputs, outputs, weights) made of them.
//
// The CPU backend computes in float32; f16 and bf16 appear as storage (KV pages, checkpoint
// tensors, wire tensors). Conversions round to nearest even, as PyTorch and CUDA intrinsics do, so
// a value stored here and read back by PyTorch is bit-identical.
//
// A Tensor is dtype, shape and a dense row-major byte buffer that it owns. It is deliberately
// small: no strides, no views, no device memory. Backends copy to their own memory as needed.
#ifndef ATTNSERVE_KERNELS_CORE_TENSOR_H_
#define ATTNSERVE_KERNELS_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace attnserve {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Bytes per element; 0 for a value that is not a DType (never a guess: a new 1-byte type must
// not be sized as 2). -Wswitch flags a new enumerator missing here.
constexpr size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  return 0;
}

// "f32", "f16", "bf16".
absl::string_view DTypeName(DType dtype);

// Accepts "f32"/"float32", "f16"/"float16"/"half", "bf16"/"bfloat16" (case-insensitive).
absl::StatusOr<DType> ParseDType(absl::string_view name);

inline float BF16ToFloat(uint16_t bits) {
  uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

inline uint16_t FloatToBF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  // Round to nearest, ties to even.
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

// Converts `count` elements of `src_dtype` at `src` to float32 at `dst`.
void ConvertToFloat(DType src_dtype, const void* src, float* dst, size_t count);

// Converts `count` float32 values at `src` to `dst_dtype` at `dst` (round to nearest even).
void ConvertFromFloat(const float* src, DType dst_dtype, void* dst, size_t count);

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor of the given dtype and shape.
  Tensor(DType dtype, std::vector<int64_t> shape);
  // A tensor of the given dtype and shape holding a copy of the bytes at `data` (as many as the
  // shape takes), written once rather than zero-filled first.
  Tensor(DType dtype, std::vector<int64_t> shape, const std::byte* data);

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

#include "kernels/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
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

// Index of the first element whose exponent bits are all ones (NaN or +-Inf), or -1. A block is
// tested without an exit per element, so the compiler vectorises it: every Forward and decode
// input and every layer output passes here (a 496-row prefill is 254k elements).
template <typename Bits>
int64_t FirstAllOnesExponent(const std::byte* data, int64_t count, Bits exponent_mask) {
  constexpr int64_t kBlock = 256;
  Bits block[kBlock];
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    std::memcpy(block, data + begin * static_cast<int64_t>(sizeof(Bits)),
                static_cast<size_t>(n) * sizeof(Bits));
    Bits any = 0;
    for (int64_t i = 0; i < n; ++i) any |= ((block[i] & exponent_mask) == exponent_mask) ? 1 : 0;
    if (any == 0) continue;
    for (int64_t i = 0; i < n; ++i) {
      if ((block[i] & exponent_mask) == exponent_mask) return begin + i;
    }
  }
  return -1;
}

// The largest |x|'s bit pattern over float32 elements: |x|'s bits order as |x| does, and an
// integer maximum vectorises where a float one (NaN-ordered) does not. Above 0x7f800000 when a NaN
// is present (the caller then takes the converting path, which skips NaN).
uint32_t MaxAbsBitsF32(const std::byte* data, int64_t count) {
  constexpr int64_t kBlock = 1024;
  uint32_t block[kBlock];
  uint32_t largest = 0;
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    std::memcpy(block, data + begin * int64_t{4}, static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) largest = std::max(largest, block[i] & 0x7fffffffu);
  }
  return largest;
}
}  // namespace

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "f32" || lower == "float32") return DType::kF32;
  if (lower == "f16" || lower == "float16" || lower == "half") return DType::kF16;
  if (lower == "bf16" || lower == "bfloat16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "': expected f32, f16 or bf16"));
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0x1f) {  // Inf or NaN.
    out = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // Normal.
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // Signed zero.
    out = sign;
  } else {  // Subnormal: normalise.
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    out = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  std::memcpy(&value, &out, sizeof(value));
  return value;
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u;   // NaN.
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // Overflows to Inf (>= 65520).
  if (abs_bits < 0x38800000u) {                        // Subnormal or zero in half.
    if (abs_bits < 0x33000000u) return sign;           // Below half of the smallest subnormal.
    const uint32_t exponent = abs_bits >> 23;
    const uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t half_mantissa = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half_mantissa & 1u))) ++half_mantissa;
    return sign | static_cast<uint16_t>(half_mantissa);
  }
  // Normal: rebias exponent and round mantissa to 10 bits, ties to even.
  uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

void ConvertToFloat(DType src_dtype, const void* src, float* dst, size_t count) {
  if (count == 0) return;  // Empty tensors may have null data; memcpy must not see it.
  switch (src_dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = BF16ToFloat(in[i]);
      return;
    }
    case DType::kF16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = HalfToFloat(in[i]);
      return;
    }
  }
}

void ConvertFromFloat(const float* src, DType dst_dtype, void* dst, size_t count) {
  if (count == 0) return;
  switch (dst_dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = FloatToBF16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = FloatToHalf(src[i]);
      return;
    }
  }
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape)
    : dtype_(dtype),
      shape_(std::move(shape)),
      bytes_(static_cast<size_t>(Product(shape_)) * DTypeSize(dtype)) {}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape, const std::byte* data)
    : dtype_(dtype), shape_(std::move(shape)) {
  const size_t bytes = static_cast<size_t>(Product(shape_)) * DTypeSize(dtype);
  if (bytes > 0) bytes_.assign(data, data + bytes);
}

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
  if (tensor.dtype() == DType::kF32) {
    const uint32_t bits = MaxAbsBitsF32(tensor.data(), tensor.num_elements());
    if (bits <= 0x7f800000u) {
      float value;
      std::memcpy(&value, &bits, sizeof(value));
      return value;
    }
  }
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

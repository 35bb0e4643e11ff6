// Element types that cross the backend boundary, and scalar conversions between them.
//
// The CPU backend computes in float32; f16 and bf16 appear as storage (KV pages, checkpoint
// tensors, wire tensors). Conversions round to nearest even, as PyTorch and CUDA intrinsics do, so
// a value stored here and read back by PyTorch is bit-identical.
#ifndef ATTNSERVE_KERNELS_CORE_DTYPE_H_
#define ATTNSERVE_KERNELS_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CORE_DTYPE_H_

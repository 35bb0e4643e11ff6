// The arithmetic of one 8-bit KV code (kernels/kv/quantization.h has the rules and the reasons):
// encoding a scaled value, decoding a code, the power-of-two scale for an absmax, and requantizing
// a code to a larger scale. One source for both backends: the CPU's quantization.cc and the CUDA
// kernels (kernels/cuda/attention/kv_append.cuh, kv_element.cuh) call these, so a page written by
// either holds the same bytes. ATTNSERVE_HD, C math only (no absl, no std:: calls nvcc lacks).
// `fp8` picks the format: true = fp8 e4m3 (kernels/core/fp8_e4m3.h), false = int8.
#ifndef ATTNSERVE_KERNELS_KV_KV_CODES_H_
#define ATTNSERVE_KERNELS_KV_KV_CODES_H_

#include <math.h>
#include <stdint.h>

#include "kernels/core/fp8_e4m3.h"
#include "kernels/core/host_device.h"

namespace attnserve {

inline constexpr float kInt8KvCodeMax = 127.0f;
inline constexpr uint8_t kInt8KvNonFinite = 0x80;  // -128: outside the symmetric range.

// Largest code magnitude: 448 (fp8 e4m3), 127 (int8).
ATTNSERVE_HD inline float KvCodeMaxOf(bool fp8) { return fp8 ? kFp8E4M3Max : kInt8KvCodeMax; }

// The code nearest to `scaled`, ties to even, saturating at the code max; NaN (and, for int8,
// +-inf) gives the non-finite code, fp8 saturates +-inf.
ATTNSERVE_HD inline uint8_t EncodeKvCodeOf(bool fp8, float scaled) {
  if (fp8) return FloatToFp8E4M3(scaled);
  if (!(fabsf(scaled) <= 3.402823466e38f)) return kInt8KvNonFinite;  // NaN or +-inf.
  const float clamped = fminf(fmaxf(scaled, -kInt8KvCodeMax), kInt8KvCodeMax);
  return static_cast<uint8_t>(static_cast<int8_t>(nearbyintf(clamped)));
}

// The value of a code (NaN for the non-finite codes).
ATTNSERVE_HD inline float DecodeKvCodeOf(bool fp8, uint8_t code) {
  if (fp8) return Fp8E4M3Value(code);
  return code == kInt8KvNonFinite ? nanf("") : static_cast<float>(static_cast<int8_t>(code));
}

// The scale of a group whose finite values reach `absmax`: 0 for 0, else the power of two
// 2^e >= absmax / code max, at least 2^-126.
ATTNSERVE_HD inline float KvScaleOf(bool fp8, float absmax) {
  if (!(absmax > 0.0f)) return 0.0f;
  int exponent;  // absmax / code_max = f * 2^exponent, f in [0.5, 1).
  const double fraction = frexp(static_cast<double>(absmax) / KvCodeMaxOf(fp8), &exponent);
  if (fraction == 0.5) --exponent;  // Already a power of two.
  return ldexpf(1.0f, exponent > -126 ? exponent : -126);
}

// The code of value x at a scale whose inverse is `inverse` (0 for scale 0: zeros). Scales are
// powers of two, so x * inverse is x / scale exactly. A non-finite x is stored as NaN.
ATTNSERVE_HD inline uint8_t QuantizeKvValue(bool fp8, float x, float inverse) {
  return EncodeKvCodeOf(fp8, fabsf(x) <= 3.402823466e38f ? x * inverse : nanf(""));
}

// A code stored at old_scale, requantized to new_scale (ratio = old_scale / new_scale, a power of
// two, or 0 when the old rows were zeros).
ATTNSERVE_HD inline uint8_t RescaleKvCode(bool fp8, uint8_t code, float ratio) {
  return EncodeKvCodeOf(fp8, DecodeKvCodeOf(fp8, code) * ratio);
}

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_KV_CODES_H_

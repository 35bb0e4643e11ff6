// OCP FP8 E4M3 ("E4M3FN", as torch.float8_e4m3fn and CUDA's __nv_fp8_e4m3): 1 sign bit, 4
// exponent bits (bias 7), 3 mantissa bits; no infinities, only S.1111.111 is NaN, so the largest
// finite value is 1.75 * 2^8 = 448 and the smallest subnormal 2^-9.
//
// Encoding rounds to nearest, ties to even, and saturates: every finite |x| > 448 and +-inf become
// +-448 (CUDA's __NV_SATFINITE), NaN stays NaN (sign kept). Decoding is exact (every code is a
// float). Used for 8-bit KV pages (kernels/kv/quantization.h).
#ifndef ATTNSERVE_KERNELS_CORE_FP8_E4M3_H_
#define ATTNSERVE_KERNELS_CORE_FP8_E4M3_H_

#include <math.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/core/host_device.h"

namespace attnserve {

inline constexpr float kFp8E4M3Max = 448.0f;

// The value of each of the 256 codes (NaN for 0x7f and 0xff).
constexpr std::array<float, 256> MakeFp8E4M3Values() {
  std::array<float, 256> values{};
  for (int code = 0; code < 256; ++code) {
    const int exponent = (code >> 3) & 15, mantissa = code & 7;
    float magnitude = 0.0f;  // Initialised: nvcc compiles this header as C++17.
    if (exponent == 15 && mantissa == 7) {
      magnitude = std::numeric_limits<float>::quiet_NaN();
    } else {
      // Subnormal: mantissa * 2^-9; normal: (8 + mantissa) * 2^(exponent - 10).
      const int shift = exponent == 0 ? -9 : exponent - 10;
      float power = 1.0f;
      for (int i = 0; i < shift; ++i) power *= 2.0f;
      for (int i = 0; i > shift; --i) power *= 0.5f;
      magnitude = static_cast<float>(exponent == 0 ? mantissa : 8 + mantissa) * power;
    }
    values[code] = (code & 0x80) != 0 ? -magnitude : magnitude;
  }
  return values;
}
inline constexpr std::array<float, 256> kFp8E4M3Values = MakeFp8E4M3Values();

inline float Fp8E4M3ToFloat(uint8_t code) { return kFp8E4M3Values[code]; }

// The same values computed rather than looked up, for device code (no table there).
ATTNSERVE_HD inline float Fp8E4M3Value(uint8_t code) {
  const int exponent = (code >> 3) & 15, mantissa = code & 7;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = nanf("");
  } else {
    // Subnormal: mantissa * 2^-9; normal: (8 + mantissa) * 2^(exponent - 10).
    magnitude = exponent == 0 ? ldexpf(static_cast<float>(mantissa), -9)
                              : ldexpf(static_cast<float>(8 + mantissa), exponent - 10);
  }
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

// C math only (fabsf, frexpf, ldexpf, nearbyintf): host and device code share it
// (kernels/kv/kv_codes.h).
ATTNSERVE_HD inline uint8_t FloatToFp8E4M3(float x) {
  const uint8_t sign = copysignf(1.0f, x) < 0.0f ? 0x80 : 0x00;
  if (x != x) return sign | 0x7f;  // NaN.
  const float magnitude = fabsf(x);
  if (magnitude >= kFp8E4M3Max) return sign | 0x7e;  // Saturate (inf included).
  if (magnitude < 0x1p-6f) {
    // Subnormal range: multiples of 2^-9 (exact scaling); 8 * 2^-9 rounds up to code 0x08, the
    // smallest normal, which is exactly the next code.
    return sign | static_cast<uint8_t>(nearbyintf(magnitude * 512.0f));
  }
  int exponent;  // magnitude = f * 2^exponent, f in [0.5, 1).
  frexpf(magnitude, &exponent);
  const int unbiased = exponent - 1;  // magnitude in [2^unbiased, 2^(unbiased + 1)).
  // Significand times 8 in [8, 16], rounded to nearest even (the default rounding mode); 16
  // carries into the exponent, which the code arithmetic below does by itself.
  const int significand = static_cast<int>(nearbyintf(ldexpf(magnitude, 3 - unbiased)));
  const int code = ((unbiased + 7) << 3) + significand - 8;
  return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CORE_FP8_E4M3_H_

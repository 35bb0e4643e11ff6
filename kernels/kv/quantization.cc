#include "kernels/kv/quantization.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/fp8_e4m3.h"
#include "kernels/kv/page_layout.h"

namespace attnserve {

namespace {

constexpr float kInt8CodeMax = 127.0f;
constexpr uint8_t kInt8NonFinite = 0x80;  // -128: outside the symmetric range.

constexpr std::array<float, 256> MakeInt8Values() {
  std::array<float, 256> values{};
  for (int code = 0; code < 256; ++code) {
    values[code] = code == kInt8NonFinite ? std::numeric_limits<float>::quiet_NaN()
                                          : static_cast<float>(static_cast<int8_t>(code));
  }
  return values;
}
constexpr std::array<float, 256> kInt8Values = MakeInt8Values();

uint8_t FloatToInt8Code(float scaled) {
  if (!std::isfinite(scaled)) return kInt8NonFinite;
  const float rounded = std::nearbyint(std::clamp(scaled, -kInt8CodeMax, kInt8CodeMax));
  return static_cast<uint8_t>(static_cast<int8_t>(rounded));
}

}  // namespace

absl::string_view KvQuantizationName(KvQuantization quantization) {
  switch (quantization) {
    case KvQuantization::kNone:
      return "none";
    case KvQuantization::kFp8E4M3:
      return "fp8_e4m3";
    case KvQuantization::kInt8:
      return "int8";
  }
  return "unknown";
}

absl::StatusOr<KvQuantization> ParseKvQuantization(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "none") return KvQuantization::kNone;
  if (lower == "fp8" || lower == "fp8_e4m3" || lower == "e4m3") return KvQuantization::kFp8E4M3;
  if (lower == "int8") return KvQuantization::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("KV quantization \"", name, "\": expected none, fp8 (fp8_e4m3) or int8"));
}

float KvCodeMax(KvQuantization quantization) {
  return quantization == KvQuantization::kFp8E4M3 ? kFp8E4M3Max : kInt8CodeMax;
}

const float* KvCodeValues(KvQuantization quantization) {
  return quantization == KvQuantization::kFp8E4M3 ? kFp8E4M3Values.data() : kInt8Values.data();
}

uint8_t EncodeKvCode(KvQuantization quantization, float scaled) {
  return quantization == KvQuantization::kFp8E4M3 ? FloatToFp8E4M3(scaled)
                                                  : FloatToInt8Code(scaled);
}

float KvScaleFor(KvQuantization quantization, float absmax) {
  if (!(absmax > 0.0f)) return 0.0f;
  int exponent;  // absmax / code_max = f * 2^exponent, f in [0.5, 1).
  const double fraction =
      std::frexp(static_cast<double>(absmax) / KvCodeMax(quantization), &exponent);
  if (fraction == 0.5) --exponent;  // Already a power of two.
  return std::ldexp(1.0f, std::max(exponent, -126));
}

float FiniteAbsMax(const float* x, int64_t n) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float magnitude = std::fabs(x[i]);
    if (magnitude <= std::numeric_limits<float>::max()) absmax = std::max(absmax, magnitude);
  }
  return absmax;
}

void QuantizeKvRow(KvQuantization quantization, const float* x, int64_t n, float scale,
                   uint8_t* codes) {
  // Scales are powers of two, so x * (1 / scale) is x / scale exactly.
  // A non-finite K/V is stored as NaN (never saturated), so the output turns non-finite and the
  // call is rolled back as with f32 pages.
  const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < n; ++i) {
    codes[i] = EncodeKvCode(quantization, std::isfinite(x[i]) ? x[i] * inverse : nan);
  }
}

void DequantizeKvRow(KvQuantization quantization, const uint8_t* codes, int64_t n, float scale,
                     float* x) {
  const float* values = KvCodeValues(quantization);
  for (int64_t i = 0; i < n; ++i) x[i] = values[codes[i]] * scale;
}

void RescaleKvCodes(KvQuantization quantization, uint8_t* codes, int64_t n, float old_scale,
                    float new_scale) {
  const float* values = KvCodeValues(quantization);
  const float ratio = old_scale / new_scale;  // A power of two (or 0: the old rows were zeros).
  for (int64_t i = 0; i < n; ++i) codes[i] = EncodeKvCode(quantization, values[codes[i]] * ratio);
}

int64_t KvPageBytes(const LayerSpec& spec, const KvStorageFormat& format, int page_size) {
  const int64_t elements = KvScalarsPerToken(spec) * page_size;
  if (!format.quantized()) return elements * static_cast<int64_t>(DTypeSize(format.element));
  const int scales = spec.variant == AttentionVariant::kMLA ? MlaPageScaleCount()
                                                            : GqaPageScaleCount(spec.num_kv_heads);
  return QuantizedPageBytes(elements, scales);
}

int64_t KvBytesPerTokenOf(const LayerSpec& spec, const KvStorageFormat& format, int page_size) {
  if (page_size <= 0) return 0;
  return (KvPageBytes(spec, format, page_size) + page_size - 1) / page_size;
}

std::string KvStorageFormatName(const KvStorageFormat& format) {
  return std::string(format.quantized() ? KvQuantizationName(format.quantization)
                                        : DTypeName(format.element));
}

}  // namespace attnserve

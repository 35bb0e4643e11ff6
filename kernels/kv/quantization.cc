#include "kernels/kv/quantization.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/fp8_e4m3.h"
#include "kernels/kv/kv_codes.h"
#include "kernels/kv/page_layout.h"

namespace attnserve {

namespace {

constexpr std::array<float, 256> MakeInt8Values() {
  std::array<float, 256> values{};
  for (int code = 0; code < 256; ++code) {
    values[code] = code == kInt8KvNonFinite ? std::numeric_limits<float>::quiet_NaN()
                                            : static_cast<float>(static_cast<int8_t>(code));
  }
  return values;
}
constexpr std::array<float, 256> kInt8Values = MakeInt8Values();

bool IsFp8(KvQuantization quantization) { return quantization == KvQuantization::kFp8E4M3; }

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

float KvCodeMax(KvQuantization quantization) { return KvCodeMaxOf(IsFp8(quantization)); }

const float* KvCodeValues(KvQuantization quantization) {
  return quantization == KvQuantization::kFp8E4M3 ? kFp8E4M3Values.data() : kInt8Values.data();
}

// The arithmetic is kernels/kv/kv_codes.h, shared with the CUDA kernels.
uint8_t EncodeKvCode(KvQuantization quantization, float scaled) {
  return EncodeKvCodeOf(IsFp8(quantization), scaled);
}

float KvScaleFor(KvQuantization quantization, float absmax) {
  return KvScaleOf(IsFp8(quantization), absmax);
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
  // A non-finite K/V is stored as NaN (never saturated), so the output turns non-finite and the
  // call is rolled back as with f32 pages.
  const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
  const bool fp8 = IsFp8(quantization);
  for (int64_t i = 0; i < n; ++i) codes[i] = QuantizeKvValue(fp8, x[i], inverse);
}

void DequantizeKvRow(KvQuantization quantization, const uint8_t* codes, int64_t n, float scale,
                     float* x) {
  const float* values = KvCodeValues(quantization);
  for (int64_t i = 0; i < n; ++i) x[i] = values[codes[i]] * scale;
}

void RescaleKvCodes(KvQuantization quantization, uint8_t* codes, int64_t n, float old_scale,
                    float new_scale) {
  const float ratio = old_scale / new_scale;  // A power of two (or 0: the old rows were zeros).
  const bool fp8 = IsFp8(quantization);
  for (int64_t i = 0; i < n; ++i) codes[i] = RescaleKvCode(fp8, codes[i], ratio);
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

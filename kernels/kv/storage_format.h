// How KV pages store their elements, kept apart from the dtype a layer computes in.
//
// Pages hold f32, f16 or bf16 elements as they are (no scales), or 8-bit codes (fp8 e4m3 or int8,
// KvQuantization) with float32 scales per page and KV head kept inside the page
// (kernels/kv/quantization.h). Neither changes what the layer computes in: the compute dtype is
// the layer's own choice (e.g. the CUDA layer's activation dtype), never read off the format.
#ifndef ATTNSERVE_KERNELS_KV_STORAGE_FORMAT_H_
#define ATTNSERVE_KERNELS_KV_STORAGE_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "kernels/core/tensor.h"

namespace attnserve {

// How stored elements are scaled back to their values.
enum class KvScaleScheme : uint8_t {
  kNone = 0,  // Elements are the values (f32, f16, bf16 pages).
  // One float32 scale per page and KV head for K and one for V (MHA/MQA/GQA), or one for the MLA
  // latent and one for its RoPE key, stored at the page's tail (kernels/kv/page_layout.h).
  kPerPageHead = 1,
};

// 8-bit element codes of a quantized page.
enum class KvQuantization : uint8_t {
  kNone = 0,
  kFp8E4M3 = 1,  // OCP E4M3FN (kernels/core/fp8_e4m3.h), max 448.
  kInt8 = 2,     // Symmetric, [-127, 127]; -128 marks a non-finite value.
};

struct KvStorageFormat {
  // Type of each stored K/V (or MLA latent and RoPE key) element; with a quantization, the type
  // the codes are dequantized to (f32).
  DType element = DType::kF32;
  KvScaleScheme scales = KvScaleScheme::kNone;
  KvQuantization quantization = KvQuantization::kNone;

  constexpr KvStorageFormat() = default;
  // A plain element type, stored without scales. Implicit: a DType reads as that format.
  constexpr KvStorageFormat(DType element_type) : element(element_type) {}  // NOLINT

  // 1-byte codes with per-page, per-head float32 scales.
  static constexpr KvStorageFormat Quantized(KvQuantization quantization) {
    KvStorageFormat format;
    format.scales = KvScaleScheme::kPerPageHead;
    format.quantization = quantization;
    return format;
  }
  constexpr bool quantized() const { return quantization != KvQuantization::kNone; }

  // Bytes of one stored element (scales, when a scheme has them, are counted apart).
  constexpr size_t ElementBytes() const { return quantized() ? 1 : DTypeSize(element); }

  friend constexpr bool operator==(const KvStorageFormat&, const KvStorageFormat&) = default;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_STORAGE_FORMAT_H_

// How KV pages store their elements, kept apart from the dtype a layer computes in.
//
// Today pages hold f32, f16 or bf16 elements as they are (no scales). An 8-bit page (fp8 or int8)
// adds a scale scheme here, and the bytes its scales take, without changing what the layer
// computes in: the compute dtype is the layer's own choice (e.g. the CUDA layer's activation
// dtype), never read off the storage format.
#ifndef ATTNSERVE_KERNELS_KV_STORAGE_FORMAT_H_
#define ATTNSERVE_KERNELS_KV_STORAGE_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace attnserve {

// How stored elements are scaled back to their values.
enum class KvScaleScheme : uint8_t {
  kNone = 0,  // Elements are the values (f32, f16, bf16 pages).
};

struct KvStorageFormat {
  DType element = DType::kF32;  // Type of each stored K/V (or MLA latent and RoPE key) element.
  KvScaleScheme scales = KvScaleScheme::kNone;

  constexpr KvStorageFormat() = default;
  // A plain element type, stored without scales. Implicit: a DType reads as that format.
  constexpr KvStorageFormat(DType element_type) : element(element_type) {}  // NOLINT

  // Bytes of one stored element (scales, when a scheme has them, are counted apart).
  constexpr size_t ElementBytes() const { return DTypeSize(element); }

  friend constexpr bool operator==(const KvStorageFormat&, const KvStorageFormat&) = default;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_STORAGE_FORMAT_H_

// Element conversions between float and the KV page types, and warp reductions. Written against
// simt.h, so the CUDA-core attention kernels that use them also run on the CPU block emulator
// (the cuda_fp16/cuda_bf16 conversions below have host implementations).
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_KV_ELEMENT_CUH_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_KV_ELEMENT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/simt/simt.h"
#include "kernels/kv/kv_codes.h"

namespace attnserve::cuda {

template <KvType kKv>
struct KvElement;
// Load(p) is the element's value, times its page's scale for the quantized types (kQuantized:
// callers multiply by PagedKv's per-page, per-KV-head scale).
template <>
struct KvElement<KvType::kF32> {
  static constexpr bool kQuantized = false;
  using T = float;
  static ATTNSERVE_SIMT float Load(const T* p) { return *p; }
  static ATTNSERVE_SIMT void Store(T* p, float x) { *p = x; }
};
template <>
struct KvElement<KvType::kF16> {
  static constexpr bool kQuantized = false;
  using T = __half;
  static ATTNSERVE_SIMT float Load(const T* p) { return __half2float(*p); }
  // Round to nearest even, as the CPU's FloatToHalf.
  static ATTNSERVE_SIMT void Store(T* p, float x) { *p = __float2half_rn(x); }
};
template <>
struct KvElement<KvType::kBF16> {
  static constexpr bool kQuantized = false;
  using T = __nv_bfloat16;
  static ATTNSERVE_SIMT float Load(const T* p) { return __bfloat162float(*p); }
  static ATTNSERVE_SIMT void Store(T* p, float x) { *p = __float2bfloat16_rn(x); }
};
// 8-bit codes: the code's value; the append (kv_append.cuh) writes them, never Store.
template <>
struct KvElement<KvType::kFp8> {
  static constexpr bool kQuantized = true;
  using T = uint8_t;
  static ATTNSERVE_SIMT float Load(const T* p) { return DecodeKvCodeOf(/*fp8=*/true, *p); }
};
template <>
struct KvElement<KvType::kInt8> {
  static constexpr bool kQuantized = true;
  using T = uint8_t;
  static ATTNSERVE_SIMT float Load(const T* p) { return DecodeKvCodeOf(/*fp8=*/false, *p); }
};

// Butterfly reductions over the 32 lanes of a warp; every lane gets the result. Every lane of the
// warp must call them together.
ATTNSERVE_SIMT float WarpMax(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, simt::ShflXor(x, offset));
  return x;
}

ATTNSERVE_SIMT float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += simt::ShflXor(x, offset);
  return x;
}

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_KV_ELEMENT_CUH_

// 8-bit KV codes (fp8 e4m3, int8) and their per-page scales: encoding, decoding, the scale rule,
// and the bytes a quantized page takes. Backend-independent; the CPU backend applies it to its
// pages in kernels/cpu/host_page_store.h.
//
// A stored value is code_value(code) * scale, where scale is a float32 kept in the page, one per
// page and scale group (a KV head's K or V; MLA's latent or RoPE key). Scales are powers of two,
// the smallest with absmax / scale <= code max (448 for fp8, 127 for int8), or 0 while the
// group holds only zeros. Pages fill incrementally, so a page's scale is set by its first row
// (slot 0) and grows when a later row's absmax needs more; the group's earlier rows are then
// requantized to the new scale. Why powers of two: rescaling an fp8 code by 2^-k is exact (until
// it falls below 2^-6), and for both formats the successive scales at least double, so the
// re-roundings sum to less than one quantization step at the final scale (int8: < scale; fp8:
// < 2^-3 relative, half of that without subnormals). The cost: int8 uses 64..127 of its range at
// worst (up to one bit less than an exact absmax scale). Everything is deterministic: the same
// rows in the same order give the same bytes.
#ifndef ATTNSERVE_KERNELS_KV_QUANTIZATION_H_
#define ATTNSERVE_KERNELS_KV_QUANTIZATION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/kv/storage_format.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

// "none", "fp8_e4m3", "int8".
absl::string_view KvQuantizationName(KvQuantization quantization);
// Accepts "none", "fp8", "fp8_e4m3", "e4m3", "int8" (case-insensitive).
absl::StatusOr<KvQuantization> ParseKvQuantization(absl::string_view name);

// Largest code magnitude: 448 (fp8 e4m3), 127 (int8).
float KvCodeMax(KvQuantization quantization);

// The value of each of the 256 codes, indexed by the code's byte (NaN for the codes that mark a
// non-finite value: fp8 0x7f/0xff, int8 -128).
const float* KvCodeValues(KvQuantization quantization);

// The code nearest to `scaled` (= value / scale), ties to even, saturating at the code max;
// NaN (and, for int8, +-inf) gives the non-finite code, fp8 saturates +-inf.
uint8_t EncodeKvCode(KvQuantization quantization, float scaled);

// The scale rule above for a group whose finite values reach `absmax`: 0 for 0, else the power
// of two 2^e >= absmax / KvCodeMax, at least 2^-126.
float KvScaleFor(KvQuantization quantization, float absmax);

// Largest |x| over the finite values of x[0, n) (0 when none).
float FiniteAbsMax(const float* x, int64_t n);

// codes[i] = EncodeKvCode(x[i] / scale); scale 0 stores zeros; a non-finite x[i] (the scale
// never counts it) gets the NaN code.
void QuantizeKvRow(KvQuantization quantization, const float* x, int64_t n, float scale,
                   uint8_t* codes);
// x[i] = value(codes[i]) * scale.
void DequantizeKvRow(KvQuantization quantization, const uint8_t* codes, int64_t n, float scale,
                     float* x);
// Requantizes codes stored at `old_scale` to `new_scale` (> old_scale, a power of two times it,
// or old_scale 0).
void RescaleKvCodes(KvQuantization quantization, uint8_t* codes, int64_t n, float old_scale,
                    float new_scale);

// Bytes of one KV page of `page_size` tokens in `format`, scales included (the page layouts of
// kernels/kv/page_layout.h), and the bytes per token a request's KV grows by on average, rounded
// up (exact for unquantized pages; for 8-bit pages, page_bytes / page_size rounded up).
int64_t KvPageBytes(const LayerSpec& spec, const KvStorageFormat& format, int page_size);
int64_t KvBytesPerTokenOf(const LayerSpec& spec, const KvStorageFormat& format, int page_size);

// "f32", "bf16", ..., or the quantization's name for an 8-bit format.
std::string KvStorageFormatName(const KvStorageFormat& format);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_QUANTIZATION_H_

#include "proto/codec/kv_quantization_codec.h"

#include "absl/strings/str_cat.h"
#include "kernels/kv/quantization.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve {

absl::StatusOr<KvQuantization> KvQuantizationFromProto(v1::KvCacheQuantization quantization,
                                                       absl::string_view field) {
  switch (quantization) {
    case v1::KV_CACHE_QUANTIZATION_NONE:
      return KvQuantization::kNone;
    case v1::KV_CACHE_QUANTIZATION_FP8_E4M3:
      return KvQuantization::kFp8E4M3;
    case v1::KV_CACHE_QUANTIZATION_INT8:
      return KvQuantization::kInt8;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", static_cast<int>(quantization),
                   ": unknown KvCacheQuantization (NONE, FP8_E4M3 or INT8)"));
}

v1::KvCacheQuantization KvQuantizationToProto(KvQuantization quantization) {
  switch (quantization) {
    case KvQuantization::kNone:
      return v1::KV_CACHE_QUANTIZATION_NONE;
    case KvQuantization::kFp8E4M3:
      return v1::KV_CACHE_QUANTIZATION_FP8_E4M3;
    case KvQuantization::kInt8:
      return v1::KV_CACHE_QUANTIZATION_INT8;
  }
  return v1::KV_CACHE_QUANTIZATION_NONE;
}

void SetKvCacheFormat(DType kv_dtype, KvQuantization quantization, v1::ConfigureRequest* request) {
  if (quantization != KvQuantization::kNone) {
    request->clear_kv_cache_dtype();
    request->set_kv_cache_quantization(KvQuantizationToProto(quantization));
  } else {
    request->set_kv_cache_dtype(DTypeToProto(kv_dtype));
  }
}

std::string KvCacheFormatName(DType kv_dtype, KvQuantization quantization) {
  return KvStorageFormatName(quantization != KvQuantization::kNone
                                 ? KvStorageFormat::Quantized(quantization)
                                 : KvStorageFormat(kv_dtype));
}

}  // namespace attnserve

// KvCacheQuantization (the API's 8-bit KV page formats) to and from the engine's KvQuantization.
#ifndef ATTNSERVE_PROTO_CODEC_KV_QUANTIZATION_CODEC_H_
#define ATTNSERVE_PROTO_CODEC_KV_QUANTIZATION_CODEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/core/tensor.h"
#include "kernels/kv/storage_format.h"

namespace attnserve {

// INVALID_ARGUMENT naming `field` for a value this server does not know.
absl::StatusOr<KvQuantization> KvQuantizationFromProto(
    v1::KvCacheQuantization quantization, absl::string_view field = "kv_cache_quantization");
v1::KvCacheQuantization KvQuantizationToProto(KvQuantization quantization);

// Sets a Configure request's KV format: kv_cache_quantization when `quantization` is not kNone
// (kv_cache_dtype then stays unset, as the server requires), else kv_cache_dtype = `kv_dtype`.
void SetKvCacheFormat(DType kv_dtype, KvQuantization quantization, v1::ConfigureRequest* request);
// The name of that format: "f32", "bf16", ..., or the quantization's ("fp8_e4m3", "int8").
std::string KvCacheFormatName(DType kv_dtype, KvQuantization quantization);

}  // namespace attnserve

#endif  // ATTNSERVE_PROTO_CODEC_KV_QUANTIZATION_CODEC_H_

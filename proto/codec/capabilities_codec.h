// attnserve::BackendCapabilities as the attnserve.v1.BackendCapabilities GetServerInfo reports.
#ifndef ATTNSERVE_PROTO_CODEC_CAPABILITIES_CODEC_H_
#define ATTNSERVE_PROTO_CODEC_CAPABILITIES_CODEC_H_

#include "attnserve/v1/attention_service.pb.h"
#include "kernels/capabilities.h"

namespace attnserve {

// Every field, in the table's order; KV formats by their kv_cache_dtype / kv_cache_quantization
// names ("f32", "bf16", "fp8_e4m3", ...).
v1::BackendCapabilities CapabilitiesToProto(const BackendCapabilities& capabilities);

}  // namespace attnserve

#endif  // ATTNSERVE_PROTO_CODEC_CAPABILITIES_CODEC_H_

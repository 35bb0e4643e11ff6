#include "server/rpc/session_info_codec.h"

#include "proto/codec/kv_quantization_codec.h"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve::server {

v1::SessionCost SessionCostToProto(const SessionCost& cost) {
  v1::SessionCost proto;
  proto.set_parameter_count(cost.parameter_count);
  proto.set_parameter_bytes(cost.parameter_bytes);
  proto.set_kv_bytes_per_token(cost.kv_bytes_per_token);
  proto.set_page_bytes(cost.page_bytes);
  proto.set_max_context_tokens(cost.max_context_tokens);
  return proto;
}

void SessionSnapshotToProto(const SessionSnapshot& snapshot, v1::SessionInfo* info) {
  info->set_session_id(snapshot.id);
  info->set_label(snapshot.label);
  *info->mutable_spec() = LayerSpecToProto(snapshot.spec);
  info->set_kv_cache_dtype(DTypeToProto(snapshot.kv_dtype));
  if (snapshot.kv_quantization != KvQuantization::kNone) {
    info->set_kv_cache_dtype(v1::DTYPE_UNSPECIFIED);  // The pages hold 8-bit codes.
    info->set_kv_cache_quantization(KvQuantizationToProto(snapshot.kv_quantization));
  }
  info->set_page_size(static_cast<int32_t>(snapshot.page_size));
  *info->mutable_cost() = SessionCostToProto(snapshot.cost);
  info->set_kv_bytes_used(snapshot.kv_bytes_used);
  v1::BatchingStats* batching = info->mutable_batching();
  batching->set_decode_batches(snapshot.batching.decode_batches);
  batching->set_decode_steps(snapshot.batching.decode_steps);
  batching->set_max_decode_batch(snapshot.batching.max_decode_batch);
  batching->set_prefill_chunks(snapshot.batching.prefill_chunks);
  batching->set_batches_retried_alone(snapshot.batching.batches_retried_alone);
  batching->set_decode_steps_waiting(snapshot.batching.decode_steps_waiting);
  info->set_idle_ns(absl::ToInt64Nanoseconds(snapshot.idle));
  info->set_fingerprint(snapshot.fingerprint);
  info->set_num_layers(snapshot.num_layers);
  info->set_per_layer(snapshot.per_layer);
  for (const LayerKindKv& kind : snapshot.kv_by_layer_kind) {
    v1::LayerKindKv* out = info->add_kv_by_layer_kind();
    out->set_kind(kind.kind);
    out->set_layers(kind.layers);
    out->set_kv_bytes(kind.kv_bytes);
  }
  for (const RequestSnapshot& request : snapshot.requests) {
    v1::RequestInfo* r = info->add_requests();
    r->set_request_id(request.request_id);
    r->set_sequence_length(request.sequence_length);
    r->set_kv_bytes(request.kv_bytes);
    r->set_idle_ns(absl::ToInt64Nanoseconds(request.idle));
    r->set_next_layer(request.next_layer);
  }
}

}  // namespace attnserve::server

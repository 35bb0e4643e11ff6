#include "client/attnctl_convert.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve {

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_F32;
    case DType::kF16:
      return v1::DTYPE_F16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return DType::kF32;
    case v1::DTYPE_F16:
      return DType::kF16;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", static_cast<int>(dtype), " is not F32, F16 or BF16"));
  }
}

namespace {

v1::Variant VariantToProto(AttentionVariant variant) {
  switch (variant) {
    case AttentionVariant::kMHA:
      return v1::VARIANT_MHA;
    case AttentionVariant::kMQA:
      return v1::VARIANT_MQA;
    case AttentionVariant::kGQA:
      return v1::VARIANT_GQA;
    case AttentionVariant::kMLA:
      return v1::VARIANT_MLA;
  }
  return v1::VARIANT_UNSPECIFIED;
}

v1::RopeLayout RopeToProto(RopeLayout rope) {
  switch (rope) {
    case RopeLayout::kNone:
      return v1::ROPE_NONE;
    case RopeLayout::kHalf:
      return v1::ROPE_HALF;
    case RopeLayout::kInterleaved:
      return v1::ROPE_INTERLEAVED;
  }
  return v1::ROPE_NONE;
}

}  // namespace

v1::LayerSpec LayerSpecToProto(const LayerSpec& spec) {
  v1::LayerSpec out;
  out.set_variant(VariantToProto(spec.variant));
  out.set_d_model(spec.d_model);
  out.set_num_heads(spec.num_heads);
  out.set_num_kv_heads(spec.num_kv_heads);
  out.set_head_dim(spec.head_dim);
  out.set_qkv_bias(spec.qkv_bias);
  out.set_o_bias(spec.o_bias);
  out.set_rope(RopeToProto(spec.rope));
  out.set_rope_theta(spec.rope_theta);
  out.set_causal(spec.causal);
  out.set_sliding_window(spec.sliding_window);
  out.set_softmax_scale(spec.softmax_scale);
  if (spec.variant == AttentionVariant::kMLA) {
    v1::MlaDims* mla = out.mutable_mla();
    mla->set_q_lora_rank(spec.mla.q_lora_rank);
    mla->set_kv_lora_rank(spec.mla.kv_lora_rank);
    mla->set_qk_nope_head_dim(spec.mla.qk_nope_head_dim);
    mla->set_qk_rope_head_dim(spec.mla.qk_rope_head_dim);
    mla->set_v_head_dim(spec.mla.v_head_dim);
    mla->set_rms_norm_eps(spec.mla.rms_norm_eps);
  }
  return out;
}

absl::StatusOr<LayerSpec> LayerSpecFromProto(const v1::LayerSpec& in) {
  LayerSpec spec;
  switch (in.variant()) {
    case v1::VARIANT_MHA:
      spec.variant = AttentionVariant::kMHA;
      break;
    case v1::VARIANT_MQA:
      spec.variant = AttentionVariant::kMQA;
      break;
    case v1::VARIANT_GQA:
      spec.variant = AttentionVariant::kGQA;
      break;
    case v1::VARIANT_MLA:
      spec.variant = AttentionVariant::kMLA;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.variant: ", static_cast<int>(in.variant()), " is not MHA, MQA, GQA or MLA"));
  }
  switch (in.rope()) {
    case v1::ROPE_NONE:
      spec.rope = RopeLayout::kNone;
      break;
    case v1::ROPE_HALF:
      spec.rope = RopeLayout::kHalf;
      break;
    case v1::ROPE_INTERLEAVED:
      spec.rope = RopeLayout::kInterleaved;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.rope: unknown layout ", static_cast<int>(in.rope())));
  }
  spec.d_model = in.d_model();
  spec.num_heads = in.num_heads();
  spec.num_kv_heads = in.num_kv_heads();
  spec.head_dim = in.head_dim();
  spec.qkv_bias = in.qkv_bias();
  spec.o_bias = in.o_bias();
  spec.rope_theta = in.rope_theta() == 0 ? 10000.0 : in.rope_theta();
  spec.causal = in.causal();
  spec.sliding_window = in.sliding_window();
  spec.softmax_scale = in.softmax_scale();
  spec.mla.q_lora_rank = in.mla().q_lora_rank();
  spec.mla.kv_lora_rank = in.mla().kv_lora_rank();
  spec.mla.qk_nope_head_dim = in.mla().qk_nope_head_dim();
  spec.mla.qk_rope_head_dim = in.mla().qk_rope_head_dim();
  spec.mla.v_head_dim = in.mla().v_head_dim();
  spec.mla.rms_norm_eps = in.mla().rms_norm_eps() == 0 ? 1e-6f : in.mla().rms_norm_eps();
  if (absl::Status status = ValidateLayerSpec(spec); !status.ok()) return status;
  return spec;
}

void TensorToProto(const Tensor& tensor, v1::Tensor* out) {
  out->set_dtype(DTypeToProto(tensor.dtype()));
  out->clear_shape();
  for (int64_t dim : tensor.shape()) out->add_shape(dim);
  out->set_data(reinterpret_cast<const char*>(tensor.data()), tensor.num_bytes());
}

absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& in) {
  absl::StatusOr<DType> dtype = DTypeFromProto(in.dtype());
  if (!dtype.ok()) return dtype.status();
  std::vector<int64_t> shape(in.shape().begin(), in.shape().end());
  int64_t elements = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return absl::InvalidArgumentError(absl::StrCat("tensor: negative dimension ", dim));
    elements *= dim;
  }
  const uint64_t expected = static_cast<uint64_t>(elements) * DTypeSize(*dtype);
  if (in.data().size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", ShapeString(shape), ": ",
                                                   in.data().size(), " data bytes, expected ",
                                                   expected));
  }
  Tensor out(*dtype, std::move(shape));
  if (expected > 0) std::memcpy(out.data(), in.data().data(), expected);
  return out;
}

std::string GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return absl::StrCat("CODE_", static_cast<int>(code));
  }
}

std::string GrpcStatusString(const grpc::Status& status) {
  return absl::StrCat(GrpcCodeName(status.error_code()), ": ", status.error_message());
}

}  // namespace attnserve

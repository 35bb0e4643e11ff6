#include "kernels/cuda/layer/projection.h"

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/runtime/cuda_status.h"

namespace attnserve::cuda {

namespace {

cudaDataType CudaType(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF32:
      break;
  }
  return CUDA_R_32F;
}

absl::Status UploadBytes(DeviceBuffer& buffer, const void* data, size_t bytes) {
  if (absl::Status s = buffer.EnsureBytes(bytes); !s.ok()) return s;
  return CudaStatus(cudaMemcpy(buffer.data(), data, bytes, cudaMemcpyHostToDevice),
                    "uploading a projection");
}

}  // namespace

absl::Status Projection::Init(const std::vector<float>& weight, const std::vector<float>& bias,
                              int out_features, int in_features, DType compute) {
  out_features_ = out_features;
  in_features_ = in_features;
  compute_ = compute;
  std::vector<std::byte> converted(weight.size() * DTypeSize(compute));
  ConvertFromFloat(weight.data(), compute, converted.data(), weight.size());
  if (absl::Status s = UploadBytes(weight_, converted.data(), converted.size()); !s.ok()) return s;
  has_bias_ = !bias.empty();
  if (has_bias_) return UploadBytes(bias_, bias.data(), bias.size() * sizeof(float));
  return absl::OkStatus();
}

int64_t Projection::parameter_bytes() const {
  const int64_t weight = static_cast<int64_t>(out_features_) * in_features_ *
                         static_cast<int64_t>(DTypeSize(compute_));
  return weight + (has_bias_ ? static_cast<int64_t>(out_features_) * sizeof(float) : 0);
}

absl::Status Projection::Run(const CublasApi& api, cublasHandle_t handle, cudaStream_t stream,
                             const void* in, int rows, float* out) const {
  if (rows == 0) return absl::OkStatus();
  if (has_bias_) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchBroadcastRows(out, static_cast<const float*>(bias_.data()),
                                                       rows, out_features_, stream),
                                   "projection bias");
  }
  const float one = 1.0f, zero = 0.0f;
  const float* beta = has_bias_ ? &one : &zero;
  // Column-major view: out^T [out_features, rows] = W (op T of the column-major W^T) . in^T.
  if (compute_ == DType::kF32) {
    return CublasStatus(
        api.sgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, out_features_, rows, in_features_, &one,
                  static_cast<const float*>(weight_.data()), in_features_,
                  static_cast<const float*>(in), in_features_, beta, out, out_features_),
        "projection (sgemm)");
  }
  const cudaDataType type = CudaType(compute_);
  return CublasStatus(
      api.gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, out_features_, rows, in_features_, &one,
                  weight_.data(), type, in_features_, in, type, in_features_, beta, out, CUDA_R_32F,
                  out_features_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "projection (GemmEx, 16-bit inputs, fp32 accumulation)");
}

}  // namespace attnserve::cuda

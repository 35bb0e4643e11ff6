// One linear projection of a layer on the GPU, out = in . W^T (+ bias), through cuBLAS.
//
// The compute dtype is the layer's: f32 (cublasSgemm, plain fp32, no TF32, so results track the
// CPU engine to fp32 rounding) or f16/bf16 (cublasGemmEx: 16-bit inputs on tensor cores, fp32
// accumulation and fp32 output). The weight lives on the device in the compute dtype, rounded once
// (round to nearest even) at upload; the bias stays fp32 and is broadcast into the output before
// the GEMM, which then accumulates onto it (beta = 1).
#ifndef ATTNSERVE_KERNELS_CUDA_LAYER_PROJECTION_H_
#define ATTNSERVE_KERNELS_CUDA_LAYER_PROJECTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/core/tensor.h"
#include "kernels/cuda/runtime/cublas_api.h"
#include "kernels/cuda/runtime/device_memory.h"

namespace attnserve::cuda {

class Projection {
 public:
  // `weight`: [out_features, in_features] row-major (the checkpoint layout); `bias`: empty or
  // [out_features].
  absl::Status Init(const std::vector<float>& weight, const std::vector<float>& bias,
                    int out_features, int in_features, DType compute);

  // out[rows, out_features] (fp32) = in[rows, in_features] (compute dtype) . W^T + bias, on
  // `stream` (the handle's stream).
  absl::Status Run(const CublasApi& api, cublasHandle_t handle, cudaStream_t stream, const void* in,
                   int rows, float* out) const;

  DType compute() const { return compute_; }
  // Bytes this projection keeps on the device: the weight in the compute dtype, the bias in fp32.
  int64_t parameter_bytes() const;

 private:
  DeviceBuffer weight_;
  DeviceBuffer bias_;
  bool has_bias_ = false;
  int out_features_ = 0;
  int in_features_ = 0;
  DType compute_ = DType::kF32;
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LAYER_PROJECTION_H_

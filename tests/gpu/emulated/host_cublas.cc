// libattnserve_host_cublas.so: the six cuBLAS entry points the CUDA backend uses (cublas_api.cc
// binds them with dlsym), implemented on the CPU with OpenBLAS for the emulated device. The
// backend loads it through its ordinary path, ATTNSERVE_CUBLAS_LIBRARY=<this file>, so its
// argument order (column-major, op T on the weight, leading dimensions) is checked against
// BLAS's own column-major semantics, which cuBLAS shares.
//
// GemmEx with 16-bit inputs widens A and B to fp32 (exact) and multiplies in fp32, as tensor
// cores do with fp32 accumulation up to summation order.
#include <cblas.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

struct HostHandle {
  int unused = 0;
};

CBLAS_TRANSPOSE Op(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

// A column-major matrix of `cols` columns and leading dimension `ld` as fp32.
bool Widen(const void* src, cudaDataType type, int ld, int cols, std::vector<float>& dst) {
  const size_t count = static_cast<size_t>(ld) * cols;
  dst.resize(count);
  for (size_t i = 0; i < count; ++i) {
    switch (type) {
      case CUDA_R_32F:
        dst[i] = static_cast<const float*>(src)[i];
        break;
      case CUDA_R_16F: {
        __half_raw raw;
        raw.x = static_cast<const uint16_t*>(src)[i];
        dst[i] = __half2float(__half(raw));
        break;
      }
      case CUDA_R_16BF: {
        __nv_bfloat16_raw raw;
        raw.x = static_cast<const uint16_t*>(src)[i];
        dst[i] = __bfloat162float(__nv_bfloat16(raw));
        break;
      }
      default:
        return false;
    }
  }
  return true;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = reinterpret_cast<cublasHandle_t>(new HostHandle);
  return CUBLAS_STATUS_SUCCESS;
}

__attribute__((visibility("default"))) cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete reinterpret_cast<HostHandle*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

__attribute__((visibility("default"))) cublasStatus_t cublasSetStream_v2(cublasHandle_t,
                                                                         cudaStream_t) {
  return CUBLAS_STATUS_SUCCESS;
}

__attribute__((visibility("default"))) cublasStatus_t cublasSetMathMode(cublasHandle_t,
                                                                        cublasMath_t) {
  return CUBLAS_STATUS_SUCCESS;
}

__attribute__((visibility("default"))) cublasStatus_t cublasSgemm_v2(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const float* alpha, const float* a, int lda, const float* b, int ldb, const float* beta,
    float* c, int ldc) {
  if (handle == nullptr || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  cblas_sgemm(CblasColMajor, Op(transa), Op(transb), m, n, k, *alpha, a, lda, b, ldb, *beta, c,
              ldc);
  return CUBLAS_STATUS_SUCCESS;
}

__attribute__((visibility("default"))) cublasStatus_t cublasGemmEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* a, cudaDataType a_type, int lda, const void* b,
    cudaDataType b_type, int ldb, const void* beta, void* c, cudaDataType c_type, int ldc,
    cublasComputeType_t compute, cublasGemmAlgo_t /*algo*/) {
  if (handle == nullptr || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (c_type != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  std::vector<float> wide_a, wide_b;
  // Columns stored: op N -> the matrix's own (k for A: m x k; n for B: k x n); op T -> transposed.
  if (!Widen(a, a_type, lda, transa == CUBLAS_OP_N ? k : m, wide_a) ||
      !Widen(b, b_type, ldb, transb == CUBLAS_OP_N ? n : k, wide_b)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  cblas_sgemm(CblasColMajor, Op(transa), Op(transb), m, n, k, *static_cast<const float*>(alpha),
              wide_a.data(), lda, wide_b.data(), ldb, *static_cast<const float*>(beta),
              static_cast<float*>(c), ldc);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

// cuBLAS loaded at run time (dlopen), so binaries carry no DT_NEEDED on libcublas and start, and
// run the CPU backend, on machines without the CUDA toolkit. Only the types come from
// <cublas_v2.h>; every function is reached through this table.
#ifndef ATTNSERVE_KERNELS_CUDA_RUNTIME_CUBLAS_API_H_
#define ATTNSERVE_KERNELS_CUDA_RUNTIME_CUBLAS_API_H_

#include <cublas_v2.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnserve::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  // The C entry point (the header also declares a C++ overload taking cudaDataType compute).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  std::string library;  // The file that was loaded, e.g. "libcublas.so.13".
};

// Loads cuBLAS once per process: $ATTNSERVE_CUBLAS_LIBRARY if set, else libcublas.so.13, .so.12,
// .so from the loader's search path. UNAVAILABLE naming every name tried when none loads.
absl::StatusOr<const CublasApi*> LoadCublas();

// OK for CUBLAS_STATUS_SUCCESS; RESOURCE_EXHAUSTED for allocation failures; INTERNAL otherwise.
absl::Status CublasStatus(cublasStatus_t status, absl::string_view what);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_RUNTIME_CUBLAS_API_H_

#include "kernels/cuda/runtime/cublas_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve::cuda {

namespace {

absl::StatusOr<CublasApi> Load() {
  std::vector<std::string> names;
  if (const char* path = std::getenv("ATTNSERVE_CUBLAS_LIBRARY"); path != nullptr && *path) {
    names.push_back(path);
  }
  names.insert(names.end(), {"libcublas.so.13", "libcublas.so.12", "libcublas.so"});
  std::vector<std::string> errors;
  for (const std::string& name : names) {
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = dlerror();
      errors.push_back(error != nullptr ? error : name);
      continue;
    }
    CublasApi api;
    api.library = name;
    bool complete = true;
    auto bind = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
      if (fn == nullptr) {
        errors.push_back(absl::StrCat(name, ": no symbol ", symbol));
        complete = false;
      }
    };
    bind(api.create, "cublasCreate_v2");
    bind(api.destroy, "cublasDestroy_v2");
    bind(api.set_stream, "cublasSetStream_v2");
    bind(api.set_math_mode, "cublasSetMathMode");
    bind(api.sgemm, "cublasSgemm_v2");
    bind(api.gemm_ex, "cublasGemmEx");
    if (complete) return api;  // The handle stays open for the life of the process.
    dlclose(handle);
  }
  return absl::UnavailableError(
      absl::StrCat("cannot load cuBLAS (set ATTNSERVE_CUBLAS_LIBRARY or LD_LIBRARY_PATH): ",
                   absl::StrJoin(errors, "; ")));
}

}  // namespace

absl::StatusOr<const CublasApi*> LoadCublas() {
  static const absl::StatusOr<CublasApi>* const loaded = new absl::StatusOr<CublasApi>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

absl::Status CublasStatus(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": cuBLAS status ", static_cast<int>(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  if (status == CUBLAS_STATUS_INVALID_VALUE) return absl::InvalidArgumentError(message);
  return absl::InternalError(message);
}

}  // namespace attnserve::cuda

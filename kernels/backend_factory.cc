#include "kernels/backend_factory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve {

bool CudaBackendBuilt() {
#if defined(ATTNSERVE_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

namespace {

#if defined(ATTNSERVE_HAVE_CUDA)
// The module's entry point (kernels/cuda/runtime/cuda_plugin.cc).
using CreateCudaFn = int (*)(const CudaBackendOptions*, AttentionBackend**, char*, size_t);

std::string ExecutableDir() {
  std::string path(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  if (n <= 0) return "";
  path.resize(static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}
#endif

absl::StatusOr<std::unique_ptr<AttentionBackend>> TryCuda(const CudaBackendOptions& options) {
#if defined(ATTNSERVE_HAVE_CUDA)
  // The module is loaded once and never unloaded (its backend's code must outlive the backend).
  static void* const module = [] {
    std::vector<std::string> candidates;
    if (const char* path = std::getenv("ATTNSERVE_CUDA_PLUGIN"); path != nullptr && *path) {
      candidates.push_back(path);
    }
    candidates.push_back(ExecutableDir() + "/libattnserve_cuda.so");
    candidates.push_back(ATTNSERVE_CUDA_PLUGIN_BUILD_PATH);
    for (const std::string& candidate : candidates) {
      if (void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    }
    return static_cast<void*>(nullptr);
  }();
  if (module == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA backend module libattnserve_cuda.so was not found (set ATTNSERVE_CUDA_PLUGIN, "
        "or put it next to the executable; build path ",
        ATTNSERVE_CUDA_PLUGIN_BUILD_PATH, ")"));
  }
  auto create = reinterpret_cast<CreateCudaFn>(dlsym(module, "AttnserveCreateCudaBackend"));
  if (create == nullptr) {
    return absl::FailedPreconditionError("libattnserve_cuda.so has no AttnserveCreateCudaBackend");
  }
  char error[1024] = {0};
  AttentionBackend* backend = nullptr;
  const int code = create(&options, &backend, error, sizeof(error));
  if (code != 0) return absl::Status(static_cast<absl::StatusCode>(code), error);
  return std::unique_ptr<AttentionBackend>(backend);
#else
  (void)options;
  return absl::FailedPreconditionError(
      "this binary was built without CUDA (nvcc was not found when it was configured, or "
      "ATTNSERVE_CUDA=OFF)");
#endif
}

}  // namespace

absl::StatusOr<BackendChoice> CreateBackend(const BackendOptions& options) {
  if (options.name != "auto" && options.name != "cpu" && options.name != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("backend = '", options.name, "', must be auto, cpu or cuda"));
  }
  BackendChoice choice;
  if (options.name != "cpu") {
    absl::StatusOr<std::unique_ptr<AttentionBackend>> cuda = TryCuda(options.cuda);
    if (cuda.ok()) {
      choice.backend = std::move(*cuda);
      choice.reason = absl::StrCat(options.name, ": CUDA device ", options.cuda.device,
                                   " is usable: ", choice.backend->device_description());
      return choice;
    }
    if (options.name == "cuda") {
      return absl::FailedPreconditionError(
          absl::StrCat("backend = cuda: ", cuda.status().message()));
    }
    choice.reason = absl::StrCat("auto: CPU, because the CUDA backend is unavailable (",
                                 cuda.status().message(), ")");
  } else {
    choice.reason = "cpu: requested";
  }
  absl::StatusOr<std::unique_ptr<AttentionBackend>> cpu = CreateCpuBackend(options.cpu);
  if (!cpu.ok()) return cpu.status();
  choice.backend = std::move(*cpu);
  return choice;
}

}  // namespace attnserve

#include "kernels/cuda/runtime/cuda_backend.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/capabilities.h"
#include "kernels/cuda/cuda_capabilities.h"
#include "kernels/cuda/runtime/cublas_api.h"
#include "kernels/cuda/runtime/cuda_device.h"
#include "kernels/cuda/layer/cuda_layer.h"
#include "kernels/cuda/layer/cuda_mla_layer.h"
#include "kernels/cuda/runtime/cuda_status.h"
#include "kernels/kv/cache_config.h"

namespace attnserve {

namespace {

class CudaBackend : public AttentionBackend {
 public:
  CudaBackend(cuda::CudaContext context, CudaDeviceInfo device)
      : context_(std::move(context)), device_(std::move(device)) {}

  absl::string_view name() const override { return "cuda"; }

  std::string device_description() const override {
    return absl::StrFormat("%s (sm_%d, %d SMs, %.1f GiB), KV pool %.2f GiB, %s, attention %s",
                           device_.name, device_.compute_capability, device_.multiprocessors,
                           device_.total_memory_bytes / double(1 << 30),
                           context_.pool->capacity_bytes() / double(1 << 30),
                           context_.cublas->library, CudaAttentionImplName(context_.attention));
  }

  int64_t kv_device_pool_bytes() const override { return context_.pool->capacity_bytes(); }

  const BackendCapabilities& capabilities() const override { return CudaCapabilities(); }

  absl::StatusOr<std::unique_ptr<AttentionLayer>> CreateLayer(
      const LayerSpec& spec, const LayerWeights& weights, const KvCacheConfig& kv_config) override {
    // Head dims the kernels are not built for, 8-bit MLA pages: refused by name
    // (CudaCapabilities) rather than computed differently.
    absl::StatusOr<KvCacheConfig> checked =
        CheckLayerRequest(capabilities(), spec, weights, kv_config);
    if (!checked.ok()) return checked.status();
    const KvCacheConfig& config = *checked;
    if (spec.variant == AttentionVariant::kMLA) {
      return cuda::CudaMlaLayer::Create(spec, weights, config, context_);
    }
    return cuda::CudaGqaLayer::Create(spec, weights, config, context_);
  }

 private:
  cuda::CudaContext context_;
  CudaDeviceInfo device_;
};

}  // namespace

bool FlashInferBuilt() {
#if defined(ATTNSERVE_HAVE_FLASHINFER)
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCudaBackend(
    const CudaBackendOptions& options) {
  if (options.attention == CudaAttentionImpl::kFlashInfer && !FlashInferBuilt()) {
    return absl::FailedPreconditionError(
        "--cuda_attention = flashinfer: this build has no FlashInfer kernels (its headers were not "
        "found when it was configured; deploy/setup.sh installs them into .venv)");
  }
  absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  if (!devices.ok()) return devices.status();
  if (options.device < 0 || options.device >= static_cast<int>(devices->size())) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", options.device, ": ",
                                                   devices->size(), " device(s) are visible"));
  }
  const CudaDeviceInfo& device = (*devices)[options.device];
  if (device.compute_capability < 80) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", options.device, " (", device.name, ") has compute capability ",
                     device.compute_capability, "; the kernels are built for sm_80 and sm_90"));
  }
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device), "cudaSetDevice");
  absl::StatusOr<const cuda::CublasApi*> cublas = cuda::LoadCublas();
  if (!cublas.ok()) return cublas.status();
  int64_t pool_bytes = options.kv_pool_bytes;
  if (pool_bytes <= 0) {
    if (!(options.kv_pool_fraction > 0.0 && options.kv_pool_fraction <= 0.95)) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv_pool_fraction = ", options.kv_pool_fraction, ": must be in (0, 0.95]"));
    }
    size_t free_bytes = 0, total_bytes = 0;
    ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    pool_bytes = static_cast<int64_t>(static_cast<double>(free_bytes) * options.kv_pool_fraction);
  }
  absl::StatusOr<std::unique_ptr<cuda::DeviceSlabPool>> pool =
      cuda::DeviceSlabPool::Create(pool_bytes, options.slab_bytes, options.poison_for_testing);
  if (!pool.ok()) return pool.status();
  cuda::CudaContext context;
  context.device = options.device;
  context.multiprocessors = device.multiprocessors;
  context.attention = options.attention != CudaAttentionImpl::kAuto ? options.attention
                      : FlashInferBuilt()                             ? CudaAttentionImpl::kFlashInfer
                                                                      : CudaAttentionImpl::kNative;
  context.cublas = *cublas;
  context.pool = std::shared_ptr<cuda::DeviceSlabPool>(std::move(*pool));
  return std::make_unique<CudaBackend>(std::move(context), device);
}

}  // namespace attnserve

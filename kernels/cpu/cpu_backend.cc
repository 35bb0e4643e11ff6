#include "kernels/cpu/cpu_backend.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/capabilities.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_capabilities.h"
#include "kernels/cpu/gqa_layer.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/mla_layer.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv/cache_config.h"

namespace attnserve {

namespace {

class CpuBackend : public AttentionBackend {
 public:
  CpuBackend(const CpuBackendOptions& options, int threads, const char* blas_config)
      : options_(options), pool_(threads), blas_config_(blas_config) {}

  absl::string_view name() const override { return "cpu"; }

  std::string device_description() const override {
    // The config string lists the core among its build options; the core is named on its own
    // as well, so that neither a reader nor a test has to parse those (blas_core.h).
    return absl::StrCat(pool_.num_threads(), " CPU threads, ", blas_config_, " (", BlasCoreName(),
                        " kernels)");
  }

  const BackendCapabilities& capabilities() const override { return CpuCapabilities(); }

  absl::StatusOr<std::unique_ptr<AttentionLayer>> CreateLayer(
      const LayerSpec& spec, const LayerWeights& weights, const KvCacheConfig& kv_config) override {
    // KV formats: f32, bf16, or 8-bit codes with per-page scales (host_page_store.h).
    absl::StatusOr<KvCacheConfig> checked =
        CheckLayerRequest(capabilities(), spec, weights, kv_config);
    if (!checked.ok()) return checked.status();
    const KvCacheConfig& config = *checked;
    if (spec.variant == AttentionVariant::kMLA) {
      return std::make_unique<MlaLayer>(spec, weights, config, options_.mla_absorbed_decode,
                                        &pool_);
    }
    return std::make_unique<GqaLayer>(spec, weights, config, options_.projection_weights,
                                      &pool_);
  }

 private:
  CpuBackendOptions options_;
  ThreadPool pool_;
  std::string blas_config_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCpuBackend(
    const CpuBackendOptions& options) {
  if (options.num_threads < 0 || options.num_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads = ", options.num_threads, ": must be in [0, 1024]"));
  }
  if (options.projection_weights != DType::kF32 && options.projection_weights != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("projection_weights = ", DTypeName(options.projection_weights),
                     ": the CPU backend keeps projection weights in f32 or bf16"));
  }
  const int threads = options.num_threads > 0
                          ? options.num_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const char* blas_config = ConfigureBlasForBackend();
  return std::make_unique<CpuBackend>(options, threads, blas_config);
}

}  // namespace attnserve

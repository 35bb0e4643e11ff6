// Where one CUDA layer call (CudaLayerBase, either layer kind) spends its time, stage by stage:
// host stages (plan, staging the upload, finishing the output) by the steady clock, device stages
// (upload, qkv GEMM, RoPE + KV append, attention, output GEMM, download) by CUDA events on the
// layer's stream; CudaMlaLayer maps its steps onto the same stages. Off by default:
// attnserve_cuda_bench turns it on to print the breakdown next to the kernels-alone sum
// (docs/gpu_benchmarks.md); serving never pays for the events.
#ifndef ATTNSERVE_KERNELS_CUDA_LAYER_STAGE_TIMER_H_
#define ATTNSERVE_KERNELS_CUDA_LAYER_STAGE_TIMER_H_

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>

namespace attnserve::cuda {

enum class LayerStage : int {
  kPlan = 0,     // Host: validate, reserve pages, PlanBatch and the FlashInfer schedule.
  kStage,        // Host: the input and the plan into pinned staging memory.
  kUpload,       // Device: one host-to-device copy, and the input to the activation dtype.
  kQkvGemm,      // Device: qkv = x . [Wq; Wk; Wv]^T (MLA: q or q_a, and the latent).
  kRopeAppend,   // Device: RoPE on q and k, K/V into the pages (MLA: the latent append,
                 // q_b_proj and the absorbed query).
  kAttention,    // Device: the attention kernels (and FlashInfer's q conversion).
  kOutGemm,      // Device: out = attn . Wo^T (MLA: W_UV first), and the output's conversion to
                 // the wire dtype.
  kDownload,     // Device: one device-to-host copy, then the stream's synchronisation.
  kFinish,       // Host: the output out of pinned staging (the tensor is allocated while the
                 // device works), the finiteness flag, eviction outside a window.
  kCount,
};

const char* LayerStageName(LayerStage stage);

// Milliseconds per stage of the last timed call.
struct LayerCallStages {
  std::array<double, static_cast<int>(LayerStage::kCount)> ms{};
  double& operator[](LayerStage s) { return ms[static_cast<int>(s)]; }
  double operator[](LayerStage s) const { return ms[static_cast<int>(s)]; }
  double Total() const;
};

// Records the stage boundaries of one call. Host stages end with EndHost; a device stage ends
// with EndDevice, which records an event on the stream; Collect (after the stream was
// synchronised) reads the events. Does nothing while disabled.
class StageTimer {
 public:
  StageTimer() = default;
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;
  ~StageTimer();

  void Enable(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // Starts a call's host clock.
  void Begin();
  // Starts the device clock on `stream`, right before the first device stage is enqueued.
  void StartDevice(cudaStream_t stream);
  void EndHost(LayerStage stage);
  void EndDevice(LayerStage stage, cudaStream_t stream);
  // Reads the device stages' times into the last call's record; the stream must be idle.
  void Collect();
  const LayerCallStages& last() const { return last_; }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_ = false;
  bool events_ready_ = false;
  Clock::time_point host_mark_;
  cudaEvent_t start_ = nullptr;
  std::array<cudaEvent_t, static_cast<int>(LayerStage::kCount)> ends_{};
  std::array<bool, static_cast<int>(LayerStage::kCount)> device_{};
  LayerCallStages last_;
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LAYER_STAGE_TIMER_H_

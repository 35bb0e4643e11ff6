#include "kernels/cuda/layer/stage_timer.h"

namespace attnserve::cuda {

const char* LayerStageName(LayerStage stage) {
  switch (stage) {
    case LayerStage::kPlan:
      return "plan";
    case LayerStage::kStage:
      return "stage";
    case LayerStage::kUpload:
      return "upload";
    case LayerStage::kQkvGemm:
      return "qkv_gemm";
    case LayerStage::kRopeAppend:
      return "rope_append";
    case LayerStage::kAttention:
      return "attention";
    case LayerStage::kOutGemm:
      return "o_gemm";
    case LayerStage::kDownload:
      return "download";
    case LayerStage::kFinish:
      return "finish";
    case LayerStage::kCount:
      break;
  }
  return "?";
}

double LayerCallStages::Total() const {
  double total = 0.0;
  for (double m : ms) total += m;
  return total;
}

StageTimer::~StageTimer() {
  if (!events_ready_) return;
  cudaEventDestroy(start_);
  for (cudaEvent_t e : ends_) cudaEventDestroy(e);
}

void StageTimer::Begin() {
  if (!enabled_) return;
  last_ = LayerCallStages();
  device_.fill(false);
  host_mark_ = Clock::now();
}

void StageTimer::StartDevice(cudaStream_t stream) {
  if (!enabled_) return;
  if (!events_ready_) {
    cudaEventCreate(&start_);
    for (cudaEvent_t& e : ends_) cudaEventCreate(&e);
    events_ready_ = true;
  }
  cudaEventRecord(start_, stream);
}

void StageTimer::EndHost(LayerStage stage) {
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  last_[stage] = std::chrono::duration<double, std::milli>(now - host_mark_).count();
  host_mark_ = now;
}

void StageTimer::EndDevice(LayerStage stage, cudaStream_t stream) {
  if (!enabled_) return;
  cudaEventRecord(ends_[static_cast<int>(stage)], stream);
  device_[static_cast<int>(stage)] = true;
}

void StageTimer::Collect() {
  if (!enabled_) return;
  cudaEvent_t previous = start_;
  for (int s = 0; s < static_cast<int>(LayerStage::kCount); ++s) {
    if (!device_[s]) continue;
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, previous, ends_[s]) == cudaSuccess) last_.ms[s] = ms;
    previous = ends_[s];
  }
  // The host clock restarts after the synchronisation: finish is measured from here.
  host_mark_ = Clock::now();
}

}  // namespace attnserve::cuda

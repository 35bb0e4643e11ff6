#include "kernels/cuda/layer/cuda_layer_base.h"

#include <climits>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/runtime/cuda_status.h"
#include "kernels/kv/quantization.h"

namespace attnserve::cuda {

absl::StatusOr<int64_t> CudaLayerBase::PageBytes(const LayerSpec& spec,
                                                 const KvCacheConfig& kv_config,
                                                 const CudaContext& context) {
  // 8-bit pages: their scales included (kernels/kv/quantization.h).
  const int64_t page_bytes = KvPageBytes(spec, kv_config.storage, kv_config.page_size);
  if (page_bytes > context.pool->slab_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size = ", kv_config.page_size, ": one page takes ", page_bytes,
        " bytes, more than the CUDA pool's slab of ", context.pool->slab_bytes(), " bytes"));
  }
  return page_bytes;
}

CudaLayerBase::CudaLayerBase(const LayerSpec& spec, const KvCacheConfig& kv_config,
                             const CudaContext& context, int64_t page_bytes)
    : spec_(spec),
      variation_(AttentionVariation::FromSpec(spec)),
      kv_config_(kv_config),
      context_(context),
      pages_(kv_config, page_bytes, spec.causal, spec.sliding_window, context.pool) {}

CudaLayerBase::~CudaLayerBase() {
  cudaSetDevice(context_.device);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (cublas_ != nullptr) context_.cublas->destroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaLayerBase::InitDevice() {
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                 "creating the layer's stream");
  {
    absl::MutexLock lock(&mu_);
    pages_.set_stream(stream_);
  }
  if (absl::Status s = CublasStatus(context_.cublas->create(&cublas_), "cublasCreate"); !s.ok()) {
    cublas_ = nullptr;
    return s;
  }
  if (absl::Status s =
          CublasStatus(context_.cublas->set_stream(cublas_, stream_), "cublasSetStream");
      !s.ok()) {
    return s;
  }
  return CublasStatus(context_.cublas->set_math_mode(cublas_, CUBLAS_DEFAULT_MATH), "math mode");
}

SequenceId CudaLayerBase::CreateSequence() {
  absl::MutexLock lock(&mu_);
  return pages_.table().Create();
}

absl::Status CudaLayerBase::ReleaseSequence(SequenceId sequence) {
  absl::MutexLock lock(&mu_);
  return pages_.table().Release(sequence);
}

absl::StatusOr<int64_t> CudaLayerBase::SequenceLength(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  return pages_.table().Length(sequence);
}

absl::StatusOr<std::vector<SequenceId>> CudaLayerBase::ForkSequence(SequenceId source, int count) {
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  return pages_.Fork(source, count);
}

absl::StatusOr<SequenceExport> CudaLayerBase::ExportSequence(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  return pages_.Export(sequence);
}

absl::Status CudaLayerBase::ImportSequenceInto(const SequenceExport& exported, SequenceId into) {
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  return pages_.Import(exported, into);
}

KvPoolUsage CudaLayerBase::PoolUsage() const {
  absl::MutexLock lock(&mu_);
  return pages_.table().Usage();
}

absl::StatusOr<int64_t> CudaLayerBase::SequenceKvBytes(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  return pages_.table().HeldBytes(sequence);
}

int64_t CudaLayerBase::KvBytesAtLength(int64_t num_tokens) const {
  absl::MutexLock lock(&mu_);
  return pages_.table().HeldBytesAtLength(num_tokens);
}

absl::Status CudaLayerBase::ReserveKvFor(absl::Span<const SequenceId> sequences,
                                         absl::Span<const int64_t> num_tokens,
                                         absl::string_view what) {
  absl::MutexLock lock(&mu_);
  return pages_.table().ReserveAhead(sequences, num_tokens, what);
}

absl::StatusOr<Tensor> CudaLayerBase::PrefillChecked(absl::Span<const PrefillChunk> chunks,
                                                     const Tensor& hidden,
                                                     absl::Span<const int64_t> positions) {
  const ChunkSequences split = SplitChunks(chunks);
  return Run(hidden, split.ids, split.counts, positions, /*decode=*/false);
}

absl::StatusOr<Tensor> CudaLayerBase::DecodeChecked(absl::Span<const SequenceId> sequences,
                                                    const Tensor& hidden,
                                                    absl::Span<const int64_t> positions) {
  const std::vector<int64_t> ones(sequences.size(), 1);
  return Run(hidden, sequences, ones, positions, /*decode=*/true);
}

absl::StatusOr<Tensor> CudaLayerBase::Run(const Tensor& hidden, absl::Span<const SequenceId> ids,
                                          absl::Span<const int64_t> counts,
                                          absl::Span<const int64_t> positions, bool decode) {
  absl::MutexLock lock(&mu_);
  timer_.Begin();
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  // An earlier failed call may have left a non-sticky error behind, which this call's launch checks
  // (cudaGetLastError) would report as their own: clear it. A sticky error (a kernel fault) cannot
  // be cleared and fails every later call, as it must.
  (void)cudaGetLastError();
  std::vector<BatchSequence> batch;
  if (absl::Status s = pages_.Reserve(ids, counts, batch); !s.ok()) return s;
  // Compute checks the output's finiteness on the device (a host pass over a prefill's output cost
  // more than its kernels).
  absl::StatusOr<Tensor> out = Compute(hidden, batch, positions, decode);
  if (!out.ok()) {
    pages_.table().Rollback(batch);
    return out.status();
  }
  for (const BatchSequence& seq : batch) pages_.table().EvictOutsideWindow(*seq.table);
  timer_.EndHost(LayerStage::kFinish);
  return out;
}

absl::StatusOr<Tensor> CudaLayerBase::Compute(const Tensor& hidden,
                                              const std::vector<BatchSequence>& batch,
                                              absl::Span<const int64_t> positions, bool decode) {
  const int64_t rows = hidden.dim(0);
  if (rows > INT_MAX / widest_row_) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", rows, " rows is too large"));
  }
  const absl::StatusOr<BatchPlan> plan =
      PlanBatch(batch, rows, positions, decode, plan_shape_,
                [this](int32_t page) { return pages_.store().PageOffset(page); });
  if (!plan.ok()) return plan.status();
  absl::StatusOr<std::unique_ptr<LayerCall>> call = LayOutCall(*plan, rows, decode, hidden.dtype());
  if (!call.ok()) return call.status();
  timer_.EndHost(LayerStage::kPlan);
  const LayerCall& l = **call;
  if (absl::Status s = StageUpload(l.up, l.o, l.device_bytes, hidden, *plan, l.flashinfer_words);
      !s.ok()) {
    return s;
  }
  timer_.EndHost(LayerStage::kStage);
  return Launch(*plan, l, rows, decode);
}

void CudaLayerBase::EnableStageTiming(bool on) {
  absl::MutexLock lock(&mu_);
  timer_.Enable(on);
}

LayerCallStages CudaLayerBase::last_call_stages() const {
  absl::MutexLock lock(&mu_);
  return timer_.last();
}

absl::Status CudaLayerBase::StageUpload(const UploadSections& up, const OutputSections& out,
                                        size_t device_bytes, const Tensor& hidden,
                                        const BatchPlan& plan,
                                        absl::Span<const int32_t> flashinfer_words) {
  if (absl::Status s = workspace_.EnsureBytes(device_bytes); !s.ok()) return s;
  if (absl::Status s = staging_.EnsureBytes(up.bytes + out.staging_bytes()); !s.ok()) return s;
  up.Write(hidden, plan, flashinfer_words, staging_.data());
  return absl::OkStatus();
}

absl::StatusOr<const void*> CudaLayerBase::Upload(const UploadSections& up, size_t device_bytes,
                                                  DType wire, DType activation,
                                                  const Section& x_act, int64_t rows) {
  timer_.StartDevice(stream_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(workspace_.data(), staging_.data(), up.bytes,
                                                 cudaMemcpyHostToDevice, stream_),
                                 "uploading the batch");
  if (context_.pool->poison() && device_bytes > up.bytes) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(static_cast<std::byte*>(workspace_.data()) + up.bytes, 0xFF,
                        device_bytes - up.bytes, stream_),
        "poisoning the workspace");
  }
  // The input from the wire dtype to the activation dtype (bf16 pages with an fp32 caller, ...): on
  // the device, so the host never converts.
  const void* x = device(up.x);
  if (wire != activation) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertActivations(x, ToKvType(wire), device(x_act), ToKvType(activation),
                                 rows * spec_.d_model, stream_),
        "input to the activation dtype");
    x = device(x_act);
  }
  timer_.EndDevice(LayerStage::kUpload, stream_);
  return x;
}

absl::StatusOr<Tensor> CudaLayerBase::Download(const OutputSections& o, size_t upload_bytes,
                                               int64_t rows) {
  const int64_t count = rows * spec_.d_model;
  // The first element that is not finite once in the wire dtype (f16 overflows at 65520, bf16 just
  // below FLT_MAX), found on the fp32 output before the conversion.
  auto* first_bad = reinterpret_cast<unsigned long long*>(device(o.first_bad));
  const float limit = o.wire == DType::kF16    ? 65520.0f
                      : o.wire == DType::kBF16 ? 3.3961776e38f
                                               : std::numeric_limits<float>::infinity();
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(first_bad, 0xFF, sizeof(*first_bad), stream_),
                                 "resetting the finiteness flag");
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      LaunchFindNonFinite(device_floats(o.out), count, limit, first_bad, stream_),
      "checking the output's finiteness");
  // The output in a 16-bit wire dtype, converted on the device: half the download, no host pass.
  if (o.wire != DType::kF32) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchConvertFloats(device_floats(o.out), ToKvType(o.wire),
                                                       device(o.out_wire), count, stream_),
                                   "output to the wire dtype");
  }
  timer_.EndDevice(LayerStage::kOutGemm, stream_);
  const Section& download = o.download();
  std::byte* host_out = staging_.data() + upload_bytes;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_out, device(download), download.bytes, cudaMemcpyDeviceToHost, stream_),
      "downloading the output");
  auto* host_first_bad = reinterpret_cast<unsigned long long*>(host_out + AlignUp(download.bytes));
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_first_bad, first_bad, sizeof(*first_bad),
                                                 cudaMemcpyDeviceToHost, stream_),
                                 "downloading the finiteness flag");
  timer_.EndDevice(LayerStage::kDownload, stream_);
  // The one host allocation of a call, the tensor returned to the caller, made while the device
  // works: a prefill's output is tens of MiB of fresh pages whose first touch (zero-filling) cost
  // more than its kernels when it followed the synchronisation (docs/gpu_benchmarks.md, finish).
  Tensor out(o.wire, {rows, spec_.d_model});
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "running the batch");
  timer_.Collect();

  if (*host_first_bad != ~0ULL) {
    return NonFiniteOutputError(out, static_cast<int64_t>(*host_first_bad));
  }
  std::memcpy(out.data(), host_out, download.bytes);
  return out;
}

}  // namespace attnserve::cuda

#include "kernels/cuda/layer/cuda_layer.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/runtime/cuda_status.h"
#include "kernels/kv/quantization.h"
#include "kernels/spec/layer_input_checks.h"
#include "kernels/spec/rope_frequencies.h"

namespace attnserve::cuda {

namespace {

constexpr size_t kAlign = 256;

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the sections of one call's workspace.
struct Section {
  size_t offset = 0;
  size_t bytes = 0;
};
class SectionLayout {
 public:
  Section Add(size_t bytes) {
    Section s{total_, bytes};
    total_ += AlignUp(bytes);
    return s;
  }
  size_t total() const { return total_; }

 private:
  size_t total_ = 0;
};

// The dtype the projections (weights and inputs) run in, chosen once from how the pages are
// stored and never read off them again: fp32 with f32 pages (the GPU then tracks the CPU engine to
// fp32 rounding), the pages' 16-bit type with 16-bit pages (tensor cores, fp32 accumulation).
// 8-bit pages (element f32: what their codes dequantize to) compute in fp32, as the CPU engine
// does with them, so both quantize the same K/V values.
DType ActivationDType(const KvStorageFormat& storage) {
  return storage.element == DType::kF32 ? DType::kF32 : storage.element;
}

// A small weight vector the kernels read (q/k norm scales, sinks), host to device.
absl::Status UploadFloats(const std::vector<float>& values, DeviceBuffer& buffer) {
  if (absl::Status s = buffer.EnsureBytes(values.size() * sizeof(float)); !s.ok()) return s;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(buffer.data(), values.data(),
                                            values.size() * sizeof(float), cudaMemcpyHostToDevice),
                                 "uploading q/k norm scales or sinks");
  return absl::OkStatus();
}

}  // namespace

CudaGqaLayer::CudaGqaLayer(const LayerSpec& spec, const KvCacheConfig& kv_config,
                           const CudaContext& context, int64_t page_bytes)
    : spec_(spec),
      kv_config_(kv_config),
      context_(context),
      q_width_(spec.num_heads * spec.head_dim),
      kv_width_(spec.num_kv_heads * spec.head_dim),
      qkv_width_(q_width_ + 2 * kv_width_),
      activation_(ActivationDType(kv_config.storage)),
      pages_(kv_config, page_bytes, spec.causal, spec.sliding_window, context.pool) {}

CudaGqaLayer::~CudaGqaLayer() {
  cudaSetDevice(context_.device);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (cublas_ != nullptr) context_.cublas->destroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<AttentionLayer>> CudaGqaLayer::Create(const LayerSpec& spec,
                                                                     const LayerWeights& weights,
                                                                     const KvCacheConfig& kv_config,
                                                                     const CudaContext& context) {
  // 8-bit pages: their scales included (kernels/kv/quantization.h).
  const int64_t page_bytes = KvPageBytes(spec, kv_config.storage, kv_config.page_size);
  if (page_bytes > context.pool->slab_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size = ", kv_config.page_size, ": one page takes ", page_bytes,
        " bytes, more than the CUDA pool's slab of ", context.pool->slab_bytes(), " bytes"));
  }
  std::unique_ptr<CudaGqaLayer> layer(new CudaGqaLayer(spec, kv_config, context, page_bytes));
  if (absl::Status s = layer->Init(weights); !s.ok()) return s;
  return std::unique_ptr<AttentionLayer>(std::move(layer));
}

absl::Status CudaGqaLayer::Init(const LayerWeights& weights) {
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                 "creating the layer's stream");
  pages_.set_stream(stream_);
  if (absl::Status s = CublasStatus(context_.cublas->create(&cublas_), "cublasCreate"); !s.ok()) {
    cublas_ = nullptr;
    return s;
  }
  if (absl::Status s =
          CublasStatus(context_.cublas->set_stream(cublas_, stream_), "cublasSetStream");
      !s.ok()) {
    return s;
  }
  // Plain fp32 (no TF32): the projections must match the CPU engine to fp32 rounding.
  if (absl::Status s =
          CublasStatus(context_.cublas->set_math_mode(cublas_, CUBLAS_DEFAULT_MATH), "math mode");
      !s.ok()) {
    return s;
  }
  // [Wq; Wk; Wv] stacked: one GEMM gives q, k and v side by side in each row.
  std::vector<float> wqkv = weights.at("q_proj.weight").ToFloats();
  std::vector<float> bqkv;
  for (const char* name : {"k_proj.weight", "v_proj.weight"}) {
    const std::vector<float> w = weights.at(name).ToFloats();
    wqkv.insert(wqkv.end(), w.begin(), w.end());
  }
  if (spec_.qkv_bias) {
    for (const char* name : {"q_proj.bias", "k_proj.bias", "v_proj.bias"}) {
      const std::vector<float> b = FloatsOrEmpty(weights, name);
      bqkv.insert(bqkv.end(), b.begin(), b.end());
    }
  }
  if (absl::Status s = qkv_proj_.Init(wqkv, bqkv, qkv_width_, spec_.d_model, activation_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          o_proj_.Init(weights.at("o_proj.weight").ToFloats(),
                       spec_.o_bias ? FloatsOrEmpty(weights, "o_proj.bias") : std::vector<float>(),
                       spec_.d_model, q_width_, activation_);
      !s.ok()) {
    return s;
  }
  if (context_.attention == CudaAttentionImpl::kFlashInfer &&
      FlashInferAttention::Serves(spec_, kv_config_)) {
    absl::StatusOr<FlashInferAttention> flashinfer =
        FlashInferAttention::Create(spec_, kv_config_, store_.page_bytes(),
                                    context_.pool->slab_bytes(), context_.pool->capacity_bytes());
    if (!flashinfer.ok()) return flashinfer.status();
    flashinfer_ = *std::move(flashinfer);
  }
  const int rotary = spec_.rope == RopeLayout::kNone ? 0 : RotaryDim(spec_);
  if (rotary > 0) {
    // The CPU RotaryEmbedding's frequencies (rope scaling included), in fp64; its cos/sin factor
    // goes with each call's RopeAppendParams.
    const std::vector<double> inv_freq = RopeInverseFrequencies(spec_);
    if (absl::Status s = inv_freq_.EnsureBytes(inv_freq.size() * sizeof(double)); !s.ok()) return s;
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(inv_freq_.data(), inv_freq.data(), inv_freq.size() * sizeof(double),
                   cudaMemcpyHostToDevice),
        "uploading RoPE frequencies");
  }
  if (spec_.qk_norm != QkNorm::kNone) {
    // [q scale | k scale], each [head_dim]: w, or 1 + w in float32 (Gemma 3) as the CPU folds it.
    std::vector<float> scales = weights.at("q_norm.weight").ToFloats();
    const std::vector<float> k_scale = weights.at("k_norm.weight").ToFloats();
    scales.insert(scales.end(), k_scale.begin(), k_scale.end());
    if (spec_.qk_norm == QkNorm::kRmsUnitOffset) {
      for (float& w : scales) w = 1.0f + w;
    }
    if (absl::Status s = UploadFloats(scales, qk_norm_scale_); !s.ok()) return s;
  }
  if (spec_.attention_sinks) {
    if (absl::Status s = UploadFloats(weights.at("sinks").ToFloats(), sinks_); !s.ok()) return s;
  }
  return absl::OkStatus();
}

SequenceId CudaGqaLayer::CreateSequence() {
  absl::MutexLock lock(&mu_);
  return sequences_.Create();
}

absl::Status CudaGqaLayer::ReleaseSequence(SequenceId sequence) {
  absl::MutexLock lock(&mu_);
  return sequences_.Release(sequence);
}

absl::StatusOr<int64_t> CudaGqaLayer::SequenceLength(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  return sequences_.Length(sequence);
}

absl::StatusOr<std::vector<SequenceId>> CudaGqaLayer::ForkSequence(SequenceId source, int count) {
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  return pages_.Fork(source, count);
}

absl::StatusOr<SequenceExport> CudaGqaLayer::ExportSequence(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  return pages_.Export(sequence);
}

absl::StatusOr<SequenceId> CudaGqaLayer::ImportSequence(const SequenceExport& exported) {
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  return pages_.Import(exported);
}

KvPoolUsage CudaGqaLayer::PoolUsage() const {
  absl::MutexLock lock(&mu_);
  return sequences_.Usage();
}

absl::StatusOr<int64_t> CudaGqaLayer::SequenceKvBytes(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  return sequences_.HeldBytes(sequence);
}

int64_t CudaGqaLayer::KvBytesAtLength(int64_t num_tokens) const {
  absl::MutexLock lock(&mu_);
  return sequences_.HeldBytesAtLength(num_tokens);
}

int64_t CudaGqaLayer::ParameterBytes() const {
  // Plus the fp32 q/k norm scales and sinks the kernels read.
  const int64_t small_floats = (spec_.qk_norm != QkNorm::kNone ? 2 * int64_t{spec_.head_dim} : 0) +
                               (spec_.attention_sinks ? int64_t{spec_.num_heads} : 0);
  return qkv_proj_.parameter_bytes() + o_proj_.parameter_bytes() +
         small_floats * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<Tensor> CudaGqaLayer::Prefill(absl::Span<const PrefillChunk> chunks,
                                             const Tensor& hidden,
                                             absl::Span<const int64_t> positions) {
  if (chunks.empty()) return absl::InvalidArgumentError("prefill: no sequences given");
  std::vector<SequenceId> ids;
  std::vector<int64_t> counts;
  for (const PrefillChunk& chunk : chunks) {
    ids.push_back(chunk.sequence);
    counts.push_back(chunk.num_tokens);
  }
  return Run(hidden, ids, counts, positions, /*decode=*/false);
}

absl::StatusOr<Tensor> CudaGqaLayer::Decode(absl::Span<const SequenceId> sequences,
                                            const Tensor& hidden,
                                            absl::Span<const int64_t> positions) {
  if (sequences.empty()) return absl::InvalidArgumentError("decode: no sequences given");
  const std::vector<int64_t> ones(sequences.size(), 1);
  return Run(hidden, sequences, ones, positions, /*decode=*/true);
}

absl::StatusOr<Tensor> CudaGqaLayer::Run(const Tensor& hidden, absl::Span<const SequenceId> ids,
                                         absl::Span<const int64_t> counts,
                                         absl::Span<const int64_t> positions, bool decode) {
  int64_t rows = 0;
  for (int64_t count : counts) rows += count;
  if (absl::Status s = CheckHiddenShape(spec_, hidden, rows); !s.ok()) return s;
  if (absl::Status s = CheckPositions(positions, rows); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  timer_.Begin();
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  // An earlier failed call may have left a non-sticky error behind, which this call's launch
  // checks (cudaGetLastError) would report as their own: clear it. A sticky error (a kernel
  // fault) cannot be cleared and fails every later call, as it must.
  (void)cudaGetLastError();
  std::vector<BatchSequence> batch;
  if (absl::Status s = pages_.Reserve(ids, counts, batch); !s.ok()) return s;
  // Compute checks the output's finiteness on the device (a host pass over a prefill's output
  // cost more than its kernels).
  absl::StatusOr<Tensor> out = Compute(hidden, batch, positions, decode);
  if (!out.ok()) {
    sequences_.Rollback(batch);
    return out.status();
  }
  for (const BatchSequence& seq : batch) sequences_.EvictOutsideWindow(*seq.table);
  timer_.EndHost(LayerStage::kFinish);
  return out;
}

void CudaGqaLayer::EnableStageTiming(bool on) {
  absl::MutexLock lock(&mu_);
  timer_.Enable(on);
}

LayerCallStages CudaGqaLayer::last_call_stages() const {
  absl::MutexLock lock(&mu_);
  return timer_.last();
}

// Where one call's buffers sit. The workspace starts with the upload region (the input and the
// plan, copied from the pinned staging buffer in one go), then the activations and the split-KV
// partials; the staging buffer holds the upload region and then the downloaded output.
struct CudaGqaLayer::CallLayout {
  // Upload region.
  Section x, positions, row_sequence, sequences, pages, items, item_begin, flashinfer_words;
  size_t upload_bytes = 0;
  // Device only. FlashInfer: qkv16 is q in the page dtype, flashinfer_scratch its split-KV
  // partials.
  // first_bad: the first output element that is not finite in the wire dtype, ~0 if none.
  // x_act: the input converted on the device to the activation dtype, when the wire's differs.
  Section x_act, qkv, attn, attn16, out, out_wire, first_bad, partial_max, partial_sum, partial_acc,
      qkv16, flashinfer_scratch;
  size_t device_bytes = 0;
  // The caller's dtype: the input is uploaded in it, the output downloaded in it (out_wire when
  // 16-bit, else out, fp32).
  DType wire = DType::kF32;
  const Section& download() const { return wire == DType::kF32 ? out : out_wire; }
};

absl::StatusOr<Tensor> CudaGqaLayer::Compute(const Tensor& hidden,
                                             const std::vector<BatchSequence>& batch,
                                             absl::Span<const int64_t> positions, bool decode) {
  const int64_t rows = hidden.dim(0);
  if (rows > INT_MAX / std::max(qkv_width_, spec_.d_model)) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", rows, " rows is too large"));
  }
  const absl::StatusOr<BatchPlan> plan =
      PlanBatch(batch, rows, positions, decode, PlanShape(),
                [this](int32_t page) { return store_.PageOffset(page); });
  if (!plan.ok()) return plan.status();
  FlashInferCall fi;
  if (flashinfer_.has_value()) {
    absl::StatusOr<FlashInferAttention::CallPlan> call = flashinfer_->Plan(*plan, decode);
    if (!call.ok()) return call.status();
    fi = *std::move(call);
  }
  const CallLayout layout = LayOut(*plan, fi, rows, decode, hidden.dtype());
  timer_.EndHost(LayerStage::kPlan);
  if (absl::Status s = Stage(hidden, *plan, fi, layout); !s.ok()) return s;
  timer_.EndHost(LayerStage::kStage);
  return Launch(*plan, fi, layout, rows, decode);
}

BatchPlanShape CudaGqaLayer::PlanShape() const {
  BatchPlanShape shape;
  shape.group = spec_.num_heads / spec_.num_kv_heads;
  shape.num_kv_heads = spec_.num_kv_heads;
  shape.decode_row_blocks = (shape.group + kAttentionRowsPerBlock - 1) / kAttentionRowsPerBlock;
  shape.prefill_rows_per_block = PrefillRowsPerBlock(kv_config_.storage, spec_.head_dim);
  shape.multiprocessors = context_.multiprocessors;
  shape.mask = MaskSpec{spec_.causal ? 1 : 0, spec_.sliding_window};
  shape.native_work_items = !flashinfer_.has_value();
  return shape;
}

CudaGqaLayer::CallLayout CudaGqaLayer::LayOut(const BatchPlan& plan, const FlashInferCall& fi,
                                              int64_t rows, bool decode, DType wire) const {
  CallLayout l;
  // Every wire dtype is one the device converts to and from: the input goes up as the caller
  // sent it, the output comes down as the caller reads it, and the host never converts.
  l.wire = wire;
  SectionLayout up;
  const size_t activation_bytes = DTypeSize(activation_);
  l.x = up.Add(DTypeSize(wire) * rows * spec_.d_model);
  l.positions = up.Add(sizeof(int64_t) * rows);
  l.row_sequence = up.Add(sizeof(int) * rows);
  l.sequences = up.Add(sizeof(SequenceDesc) * plan.sequences.size());
  l.pages = up.Add(sizeof(int64_t) * std::max<size_t>(1, plan.page_offsets.size()));
  l.items = up.Add(sizeof(WorkItem) * plan.items.size());
  l.item_begin = up.Add(sizeof(int) * plan.item_begin.size());
  l.flashinfer_words = up.Add(fi.has_value() ? sizeof(int32_t) * fi->words.size() : 0);
  l.upload_bytes = up.total();
  SectionLayout dev = up;
  l.x_act = dev.Add(wire == activation_ ? 0 : activation_bytes * rows * spec_.d_model);
  l.qkv = dev.Add(sizeof(float) * rows * qkv_width_);
  l.attn = dev.Add(fi.has_value() ? 0 : sizeof(float) * rows * q_width_);  // Native only.
  // The attention output in the activation dtype, when the output projection reads 16-bit.
  l.attn16 = dev.Add(activation_ == DType::kF32 ? 0 : activation_bytes * rows * q_width_);
  l.out = dev.Add(sizeof(float) * rows * spec_.d_model);
  // The output in a 16-bit wire dtype, converted on the device: half the download, no host pass.
  l.out_wire = dev.Add(l.wire == DType::kF32 ? 0 : DTypeSize(l.wire) * rows * spec_.d_model);
  l.first_bad = dev.Add(sizeof(unsigned long long));
  l.qkv16 = dev.Add(fi.has_value() ? activation_bytes * rows * qkv_width_ : 0);
  l.flashinfer_scratch = dev.Add(fi.has_value() ? fi->scratch_bytes : 0);
  // The native decode's split partials (none when FlashInfer computes the attention).
  const int64_t partial_rows =
      decode && !fi.has_value() ? static_cast<int64_t>(plan.items.size()) * spec_.num_heads : 0;
  l.partial_max = dev.Add(sizeof(float) * partial_rows);
  l.partial_sum = dev.Add(sizeof(float) * partial_rows);
  l.partial_acc = dev.Add(sizeof(float) * partial_rows * spec_.head_dim);
  l.device_bytes = dev.total();
  return l;
}

absl::Status CudaGqaLayer::Stage(const Tensor& hidden, const BatchPlan& plan,
                                 const FlashInferCall& fi, const CallLayout& l) {
  if (absl::Status s = workspace_.EnsureBytes(l.device_bytes); !s.ok()) return s;
  if (absl::Status s = staging_.EnsureBytes(l.upload_bytes + AlignUp(l.download().bytes) +
                                            sizeof(unsigned long long));
      !s.ok()) {
    return s;
  }
  std::byte* host = staging_.data();
  auto put = [&](const Section& section, const void* src) {
    if (section.bytes > 0) std::memcpy(host + section.offset, src, section.bytes);
  };
  put(l.x, hidden.data());  // In the wire dtype; converted on the device.
  put(l.positions, plan.positions.data());
  put(l.row_sequence, plan.row_sequence.data());
  put(l.sequences, plan.sequences.data());
  if (!plan.page_offsets.empty()) put(l.pages, plan.page_offsets.data());
  put(l.items, plan.items.data());
  put(l.item_begin, plan.item_begin.data());
  if (fi.has_value()) put(l.flashinfer_words, fi->words.data());
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CudaGqaLayer::Launch(const BatchPlan& plan, const FlashInferCall& fi,
                                            const CallLayout& l, int64_t rows, bool decode) {
  std::byte* host = staging_.data();
  auto* device = static_cast<std::byte*>(workspace_.data());
  auto dptr = [&](const Section& section) { return device + section.offset; };
  auto fptr = [&](const Section& section) { return reinterpret_cast<float*>(dptr(section)); };

  timer_.StartDevice(stream_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device, host, l.upload_bytes, cudaMemcpyHostToDevice, stream_),
      "uploading the batch");
  if (context_.pool->poison()) {
    const size_t begin = l.x_act.offset, end = l.device_bytes;
    ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device + begin, 0xFF, end - begin, stream_),
                                   "poisoning the workspace");
  }
  // The input from the wire dtype to the activation dtype (bf16 pages with an fp32 caller, ...).
  const void* x = dptr(l.x);
  if (l.wire != activation_) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertActivations(x, ToKvType(l.wire), dptr(l.x_act), ToKvType(activation_),
                                 rows * spec_.d_model, stream_),
        "input to the activation dtype");
    x = dptr(l.x_act);
  }
  timer_.EndDevice(LayerStage::kUpload, stream_);
  // qkv[rows, q | k | v] = x . [Wq; Wk; Wv]^T (+ bias)
  const int m_rows = static_cast<int>(rows);
  if (absl::Status s = qkv_proj_.Run(*context_.cublas, cublas_, stream_, x, m_rows, fptr(l.qkv));
      !s.ok()) {
    return s;
  }
  timer_.EndDevice(LayerStage::kQkvGemm, stream_);
  // RoPE(q, k) at the plan's positions; k, v -> pages.
  RopeAppendParams rope;
  rope.qkv = fptr(l.qkv);
  rope.qkv_stride = qkv_width_;
  rope.positions = reinterpret_cast<const int64_t*>(dptr(l.positions));
  rope.row_sequence = reinterpret_cast<const int*>(dptr(l.row_sequence));
  rope.sequences = reinterpret_cast<const SequenceDesc*>(dptr(l.sequences));
  rope.inv_freq = static_cast<const double*>(inv_freq_.data());
  rope.rows = m_rows;
  rope.num_heads = spec_.num_heads;
  rope.rotary_dim = spec_.rope == RopeLayout::kNone ? 0 : RotaryDim(spec_);
  rope.interleaved = spec_.rope == RopeLayout::kInterleaved ? 1 : 0;
  rope.attention_factor = static_cast<float>(RopeAttentionFactor(spec_));
  if (spec_.qk_norm != QkNorm::kNone) {
    const auto* scales = static_cast<const float*>(qk_norm_scale_.data());
    rope.qk_norm = {scales, scales + spec_.head_dim, spec_.qk_norm_eps};
  }
  rope.kv_type = ToKvType(kv_config_.storage);
  rope.batch = static_cast<int>(plan.sequences.size());
  rope.kv = PagedView(l);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchRopeAppend(rope, stream_), "RoPE + KV append launch");
  timer_.EndDevice(LayerStage::kRopeAppend, stream_);

  if (absl::Status s = RunAttention(plan, fi, l, rows, decode); !s.ok()) return s;
  timer_.EndDevice(LayerStage::kAttention, stream_);

  // out[rows, d_model] = attn . Wo^T (+ bias), from attn16 when the projection reads 16-bit (the
  // native kernels write fp32 attn, converted here; FlashInfer writes attn16 itself).
  const void* attn_in = fptr(l.attn);
  if (activation_ != DType::kF32) {
    if (!fi.has_value()) {
      ATTNSERVE_CUDA_RETURN_IF_ERROR(
          LaunchConvertFloats(fptr(l.attn), ToKvType(activation_), dptr(l.attn16),
                              int64_t{rows} * q_width_, stream_),
          "attention output to the activation dtype");
    }
    attn_in = dptr(l.attn16);
  }
  if (absl::Status s =
          o_proj_.Run(*context_.cublas, cublas_, stream_, attn_in, m_rows, fptr(l.out));
      !s.ok()) {
    return s;
  }
  // The first element that is not finite once in the wire dtype (f16 overflows at 65520, bf16
  // just below FLT_MAX), found on the fp32 output before the conversion.
  auto* first_bad = reinterpret_cast<unsigned long long*>(dptr(l.first_bad));
  const float limit = l.wire == DType::kF16    ? 65520.0f
                      : l.wire == DType::kBF16 ? 3.3961776e38f
                                               : std::numeric_limits<float>::infinity();
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(first_bad, 0xFF, sizeof(*first_bad), stream_),
                                 "resetting the finiteness flag");
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      LaunchFindNonFinite(fptr(l.out), int64_t{rows} * spec_.d_model, limit, first_bad, stream_),
      "checking the output's finiteness");
  if (l.wire != DType::kF32) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertFloats(fptr(l.out), ToKvType(l.wire), dptr(l.out_wire),
                            int64_t{rows} * spec_.d_model, stream_),
        "output to the wire dtype");
  }
  timer_.EndDevice(LayerStage::kOutGemm, stream_);
  const Section& download = l.download();
  std::byte* host_out = host + l.upload_bytes;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_out, dptr(download), download.bytes, cudaMemcpyDeviceToHost, stream_),
      "downloading the output");
  unsigned long long* host_first_bad =
      reinterpret_cast<unsigned long long*>(host_out + AlignUp(download.bytes));
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_first_bad, first_bad, sizeof(*first_bad),
                                                 cudaMemcpyDeviceToHost, stream_),
                                 "downloading the finiteness flag");
  timer_.EndDevice(LayerStage::kDownload, stream_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "running the batch");
  timer_.Collect();

  Tensor out(l.wire, {rows, spec_.d_model});
  if (*host_first_bad != ~0ULL) {
    return NonFiniteOutputError(out, static_cast<int64_t>(*host_first_bad));
  }
  std::memcpy(out.data(), host_out, download.bytes);
  return out;
}

PagedKv CudaGqaLayer::PagedView(const CallLayout& l) const {
  PagedKv kv;
  kv.pool = store_.pool_base();
  kv.page_offsets =
      reinterpret_cast<const int64_t*>(static_cast<std::byte*>(workspace_.data()) + l.pages.offset);
  kv.page_size = kv_config_.page_size;
  kv.num_kv_heads = spec_.num_kv_heads;
  kv.head_dim = spec_.head_dim;
  if (kv_config_.storage.quantized()) {
    kv.scales_offset = QuantizedPageScaleOffset(
        GqaPageElements(kv_config_.page_size, spec_.num_kv_heads, spec_.head_dim));
  }
  return kv;
}

absl::Status CudaGqaLayer::RunAttention(const BatchPlan& plan, const FlashInferCall& fi,
                                        const CallLayout& l, int64_t rows, bool decode) {
  auto* device = static_cast<std::byte*>(workspace_.data());
  auto dptr = [&](const Section& section) { return device + section.offset; };
  auto fptr = [&](const Section& section) { return reinterpret_cast<float*>(dptr(section)); };
  if (fi.has_value()) {
    // q in the page dtype for FlashInfer (the whole fused row: one contiguous conversion), then
    // its output straight into the output projection's 16-bit input.
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertFloats(fptr(l.qkv), ToKvType(kv_config_.storage.element), dptr(l.qkv16),
                            int64_t{rows} * qkv_width_, stream_),
        "q to the page dtype");
    return flashinfer_->Launch(*fi, reinterpret_cast<const int32_t*>(dptr(l.flashinfer_words)),
                               store_.pool_base(), dptr(l.qkv16), qkv_width_, dptr(l.attn16),
                               dptr(l.flashinfer_scratch), stream_);
  }
  // attn[rows, heads * head_dim]: one block per work item of the plan.
  const BatchPlanShape shape = PlanShape();
  AttentionParams attn;
  attn.q = fptr(l.qkv);
  attn.q_stride = qkv_width_;
  attn.out = fptr(l.attn);
  attn.num_heads = spec_.num_heads;
  attn.group = shape.group;
  attn.scale = EffectiveSoftmaxScale(spec_);
  attn.mask = shape.mask;
  attn.variant.softcap = spec_.attn_logit_softcapping;
  attn.variant.sinks = spec_.attention_sinks ? static_cast<const float*>(sinks_.data()) : nullptr;
  attn.kv = PagedView(l);
  attn.sequences = reinterpret_cast<const SequenceDesc*>(dptr(l.sequences));
  attn.batch = static_cast<int>(plan.sequences.size());
  attn.items = reinterpret_cast<const WorkItem*>(dptr(l.items));
  attn.num_items = static_cast<int>(plan.items.size());
  if (!decode) return RunPrefillAttention(kv_config_.storage, spec_.head_dim, attn, stream_);
  attn.partial_max = fptr(l.partial_max);
  attn.partial_sum = fptr(l.partial_sum);
  attn.partial_acc = fptr(l.partial_acc);
  attn.item_begin = reinterpret_cast<const int*>(dptr(l.item_begin));
  return RunDecodeAttention(kv_config_.storage, spec_.head_dim, attn, shape.decode_row_blocks,
                            stream_);
}

}  // namespace attnserve::cuda

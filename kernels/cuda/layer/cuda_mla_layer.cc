#include "kernels/cuda/layer/cuda_mla_layer.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/mla/mla_dispatch.h"
#include "kernels/cuda/mla/mla_params.h"
#include "kernels/cuda/runtime/cuda_status.h"
#include "kernels/kv/quantization.h"
#include "kernels/spec/layer_input_checks.h"
#include "kernels/spec/rope_frequencies.h"

namespace attnserve::cuda {

namespace {

constexpr size_t kAlign = 256;

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

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

absl::Status Upload(DeviceBuffer& buffer, const std::vector<float>& host, const char* what) {
  if (absl::Status s = buffer.EnsureBytes(std::max<size_t>(1, host.size()) * sizeof(float));
      !s.ok()) {
    return s;
  }
  if (host.empty()) return absl::OkStatus();
  return CudaStatus(
      cudaMemcpy(buffer.data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
      what);
}

}  // namespace

CudaMlaLayer::CudaMlaLayer(const LayerSpec& spec, const KvCacheConfig& kv_config,
                           const CudaContext& context, int64_t page_bytes)
    : spec_(spec),
      kv_config_(kv_config),
      context_(context),
      dims_(spec.mla),
      qk_dim_(spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim),
      row_width_(spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim),
      kv_b_width_(spec.mla.qk_nope_head_dim + spec.mla.v_head_dim),
      // As CudaGqaLayer's: fp32 with f32 pages, the pages' 16-bit type with 16-bit pages (8-bit
      // MLA pages are refused by the capability table).
      activation_(kv_config.storage.element),
      sequences_(kv_config, page_bytes, spec.causal, spec.sliding_window, context.pool) {}

CudaMlaLayer::~CudaMlaLayer() {
  cudaSetDevice(context_.device);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (cublas_ != nullptr) context_.cublas->destroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<AttentionLayer>> CudaMlaLayer::Create(const LayerSpec& spec,
                                                                     const LayerWeights& weights,
                                                                     const KvCacheConfig& kv_config,
                                                                     const CudaContext& context) {
  if (absl::Status s = CheckMlaKernelDims(spec.mla.kv_lora_rank, spec.mla.qk_rope_head_dim,
                                          spec.mla.qk_nope_head_dim);
      !s.ok()) {
    return s;
  }
  const int64_t page_bytes = KvPageBytes(spec, kv_config.storage, kv_config.page_size);
  if (page_bytes > context.pool->slab_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size = ", kv_config.page_size, ": one page takes ", page_bytes,
        " bytes, more than the CUDA pool's slab of ", context.pool->slab_bytes(), " bytes"));
  }
  std::unique_ptr<CudaMlaLayer> layer(new CudaMlaLayer(spec, kv_config, context, page_bytes));
  if (absl::Status s = layer->Init(weights); !s.ok()) return s;
  return std::unique_ptr<AttentionLayer>(std::move(layer));
}

absl::Status CudaMlaLayer::Init(const LayerWeights& weights) {
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                 "creating the layer's stream");
  absl::MutexLock lock(&mu_);
  sequences_.set_stream(stream_);
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
  const int heads = spec_.num_heads;
  const int q_width = heads * qk_dim_;
  const int kv_lora = dims_.kv_lora_rank, v = dims_.v_head_dim;
  if (dims_.q_lora_rank == 0) {
    if (absl::Status s = q_proj_.Init(weights.at("q_proj.weight").ToFloats(), {}, q_width,
                                      spec_.d_model, activation_);
        !s.ok()) {
      return s;
    }
  } else {
    if (absl::Status s = q_proj_.Init(weights.at("q_a_proj.weight").ToFloats(), {},
                                      dims_.q_lora_rank, spec_.d_model, activation_);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = q_b_proj_.Init(weights.at("q_b_proj.weight").ToFloats(), {}, q_width,
                                        dims_.q_lora_rank, activation_);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            Upload(q_norm_, weights.at("q_a_layernorm.weight").ToFloats(), "uploading q_a_norm");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = kv_a_proj_.Init(weights.at("kv_a_proj_with_mqa.weight").ToFloats(), {},
                                       row_width_, spec_.d_model, activation_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = o_proj_.Init(weights.at("o_proj.weight").ToFloats(), {}, spec_.d_model,
                                    heads * v, activation_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          Upload(kv_norm_, weights.at("kv_a_layernorm.weight").ToFloats(), "uploading kv_a_norm");
      !s.ok()) {
    return s;
  }
  // kv_b_proj [H * (nope + v), kv_lora]: W_UK_h is read in place (rows h(nope+v) .. +nope);
  // W_UV_h (the next v rows) is transposed to [kv_lora, v] so the output kernel reads it
  // coalesced.
  const std::vector<float> kv_b = weights.at("kv_b_proj.weight").ToFloats();
  std::vector<float> uv_t(static_cast<size_t>(heads) * kv_lora * v);
  for (int h = 0; h < heads; ++h) {
    for (int j = 0; j < v; ++j) {
      const float* row =
          &kv_b[(static_cast<size_t>(h) * kv_b_width_ + dims_.qk_nope_head_dim + j) * kv_lora];
      for (int l = 0; l < kv_lora; ++l)
        uv_t[(static_cast<size_t>(h) * kv_lora + l) * v + j] = row[l];
    }
  }
  if (absl::Status s = Upload(w_kv_b_, kv_b, "uploading kv_b_proj"); !s.ok()) return s;
  if (absl::Status s = Upload(w_uv_t_, uv_t, "uploading W_UV"); !s.ok()) return s;
  if (context_.attention == CudaAttentionImpl::kFlashInfer &&
      FlashInferMlaAttention::Serves(spec_, kv_config_, context_.pool->capacity_bytes())) {
    flashinfer_ =
        FlashInferMlaAttention::Create(spec_, kv_config_, sequences_.store().page_bytes(),
                                       context_.pool->slab_bytes(), context_.multiprocessors);
  }
  if (spec_.rope != RopeLayout::kNone && dims_.qk_rope_head_dim > 0) {
    // The CPU RotaryEmbedding's frequencies (YaRN included), in fp64. Its cos/sin factor has no
    // place in the kernel: the capability table refuses specs where it is not 1.
    const std::vector<double> inv_freq = RopeInverseFrequencies(spec_);
    if (absl::Status s = inv_freq_.EnsureBytes(inv_freq.size() * sizeof(double)); !s.ok()) return s;
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(inv_freq_.data(), inv_freq.data(), inv_freq.size() * sizeof(double),
                   cudaMemcpyHostToDevice),
        "uploading RoPE frequencies");
  }
  return absl::OkStatus();
}

SequenceId CudaMlaLayer::CreateSequence() {
  absl::MutexLock lock(&mu_);
  return sequences_.table().Create();
}

absl::Status CudaMlaLayer::ReleaseSequence(SequenceId sequence) {
  absl::MutexLock lock(&mu_);
  return sequences_.table().Release(sequence);
}

absl::StatusOr<int64_t> CudaMlaLayer::SequenceLength(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  return sequences_.table().Length(sequence);
}

absl::StatusOr<std::vector<SequenceId>> CudaMlaLayer::ForkSequence(SequenceId source, int count) {
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  return sequences_.Fork(source, count);
}

absl::StatusOr<SequenceExport> CudaMlaLayer::ExportSequence(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  return sequences_.Export(sequence);
}

absl::StatusOr<SequenceId> CudaMlaLayer::ImportSequence(const SequenceExport& exported) {
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  return sequences_.Import(exported);
}

KvPoolUsage CudaMlaLayer::PoolUsage() const {
  absl::MutexLock lock(&mu_);
  return sequences_.table().Usage();
}

absl::StatusOr<int64_t> CudaMlaLayer::SequenceKvBytes(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  return sequences_.table().HeldBytes(sequence);
}

int64_t CudaMlaLayer::KvBytesAtLength(int64_t num_tokens) const {
  absl::MutexLock lock(&mu_);
  return sequences_.table().HeldBytesAtLength(num_tokens);
}

int64_t CudaMlaLayer::ParameterBytes() const {
  return q_proj_.parameter_bytes() + q_b_proj_.parameter_bytes() + kv_a_proj_.parameter_bytes() +
         o_proj_.parameter_bytes() +
         static_cast<int64_t>(sizeof(float)) *
             (dims_.q_lora_rank + dims_.kv_lora_rank +
              int64_t{spec_.num_heads} * kv_b_width_ * dims_.kv_lora_rank +
              int64_t{spec_.num_heads} * dims_.kv_lora_rank * dims_.v_head_dim);
}

absl::StatusOr<Tensor> CudaMlaLayer::Prefill(absl::Span<const PrefillChunk> chunks,
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

absl::StatusOr<Tensor> CudaMlaLayer::Decode(absl::Span<const SequenceId> sequences,
                                            const Tensor& hidden,
                                            absl::Span<const int64_t> positions) {
  if (sequences.empty()) return absl::InvalidArgumentError("decode: no sequences given");
  const std::vector<int64_t> ones(sequences.size(), 1);
  return Run(hidden, sequences, ones, positions, /*decode=*/true);
}

absl::StatusOr<Tensor> CudaMlaLayer::Run(const Tensor& hidden, absl::Span<const SequenceId> ids,
                                         absl::Span<const int64_t> counts,
                                         absl::Span<const int64_t> positions, bool decode) {
  int64_t rows = 0;
  for (int64_t count : counts) rows += count;
  if (absl::Status s = CheckHiddenShape(spec_, hidden, rows); !s.ok()) return s;
  if (absl::Status s = CheckPositions(positions, rows); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  // A non-sticky error an earlier failed call left would be reported by this call's launch
  // checks as their own: clear it (a sticky one cannot be cleared and fails every call).
  (void)cudaGetLastError();
  std::vector<BatchSequence> batch;
  if (absl::Status s = sequences_.Reserve(ids, counts, batch); !s.ok()) return s;
  absl::StatusOr<Tensor> out = Compute(hidden, batch, positions, decode);
  if (!out.ok()) {
    sequences_.table().Rollback(batch);
    return out.status();
  }
  for (const BatchSequence& seq : batch) sequences_.table().EvictOutsideWindow(*seq.table);
  return out;
}

// Where one call's buffers sit: the upload region (input and plan, one copy from the pinned
// staging buffer), then the activations and the split-KV partials.
struct CudaMlaLayer::CallLayout {
  Section x, positions, row_sequence, sequences, pages, items, item_begin, flashinfer_words;
  size_t upload_bytes = 0;
  // FlashInfer only: q16 the absorbed queries in bf16, o16 its bf16 output, scratch its partials.
  Section q16, o16, flashinfer_scratch;
  // x_act: [rows, d_model] the input in the activation dtype, when the wire's differs;
  // q_a: [rows, q_lora] (q_lora_rank > 0); latent: [rows, kv_lora + rope]; q: [rows, H, qk];
  // q_lat: [rows, H, kv_lora + rope]; o_lat: [rows, H, kv_lora]; attn: [rows, H * v];
  // q_a16, attn16: q_a (normalised) and attn in the activation dtype, for 16-bit projections.
  Section x_act, q_a, q_a16, latent, q, q_lat, o_lat, attn, attn16, out, out_wire, first_bad,
      partial_max, partial_sum, partial_acc;
  size_t device_bytes = 0;
  // The caller's dtype: the input is uploaded in it, the output downloaded in it.
  DType wire = DType::kF32;
  const Section& download() const { return wire == DType::kF32 ? out : out_wire; }
};

BatchPlanShape CudaMlaLayer::PlanShape() const {
  // Every head is a query row of the one shared KV head (the cached latent row).
  BatchPlanShape shape;
  shape.group = spec_.num_heads;
  shape.num_kv_heads = 1;
  shape.decode_row_blocks = (spec_.num_heads + kMlaRowsPerBlock - 1) / kMlaRowsPerBlock;
  shape.prefill_rows_per_block = kMlaRowsPerBlock;
  shape.multiprocessors = context_.multiprocessors;
  shape.mask = MaskSpec{spec_.causal ? 1 : 0, spec_.sliding_window};
  shape.native_work_items = !flashinfer_.has_value();
  return shape;
}

absl::StatusOr<Tensor> CudaMlaLayer::Compute(const Tensor& hidden,
                                             const std::vector<BatchSequence>& batch,
                                             absl::Span<const int64_t> positions, bool decode) {
  const int64_t rows = hidden.dim(0);
  const int64_t widest =
      std::max<int64_t>({spec_.d_model, int64_t{spec_.num_heads} * std::max(qk_dim_, row_width_)});
  if (rows > INT_MAX / widest) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", rows, " rows is too large"));
  }
  const absl::StatusOr<BatchPlan> plan =
      PlanBatch(batch, rows, positions, decode, PlanShape(),
                [this](int32_t page) { return sequences_.store().PageOffset(page); });
  if (!plan.ok()) return plan.status();
  FlashInferCall fi;
  if (flashinfer_.has_value()) {
    absl::StatusOr<FlashInferMlaAttention::CallPlan> call = flashinfer_->Plan(*plan);
    if (!call.ok()) return call.status();
    fi = *std::move(call);
  }
  const CallLayout layout = LayOut(*plan, fi, rows, decode, hidden.dtype());
  if (absl::Status s = Stage(hidden, *plan, fi, layout); !s.ok()) return s;
  return Launch(*plan, fi, layout, rows, decode);
}

CudaMlaLayer::CallLayout CudaMlaLayer::LayOut(const BatchPlan& plan, const FlashInferCall& fi,
                                              int64_t rows, bool decode, DType wire) const {
  CallLayout l;
  l.wire = wire;  // Converted on the device both ways, as CudaGqaLayer::LayOut.
  const int64_t heads = spec_.num_heads;
  const size_t activation_bytes = DTypeSize(activation_);
  const bool narrow = activation_ != DType::kF32;  // 16-bit projections.
  SectionLayout up;
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
  l.q_a = dev.Add(sizeof(float) * rows * dims_.q_lora_rank);
  l.q_a16 = dev.Add(narrow ? activation_bytes * rows * dims_.q_lora_rank : 0);
  l.latent = dev.Add(sizeof(float) * rows * row_width_);
  l.q = dev.Add(sizeof(float) * rows * heads * qk_dim_);
  l.q_lat = dev.Add(sizeof(float) * rows * heads * row_width_);
  l.o_lat = dev.Add(fi.has_value() ? 0 : sizeof(float) * rows * heads * dims_.kv_lora_rank);
  l.attn = dev.Add(sizeof(float) * rows * heads * dims_.v_head_dim);
  l.attn16 = dev.Add(narrow ? activation_bytes * rows * heads * dims_.v_head_dim : 0);
  l.out = dev.Add(sizeof(float) * rows * spec_.d_model);
  l.out_wire = dev.Add(l.wire == DType::kF32 ? 0 : DTypeSize(l.wire) * rows * spec_.d_model);
  l.first_bad = dev.Add(sizeof(unsigned long long));
  l.q16 = dev.Add(fi.has_value() ? 2 * rows * heads * row_width_ : 0);
  l.o16 = dev.Add(fi.has_value() ? 2 * rows * heads * dims_.kv_lora_rank : 0);
  l.flashinfer_scratch = dev.Add(fi.has_value() ? fi->scratch_bytes : 0);
  const int64_t partial_rows =
      decode && !fi.has_value() ? static_cast<int64_t>(plan.items.size()) * heads : 0;
  l.partial_max = dev.Add(sizeof(float) * partial_rows);
  l.partial_sum = dev.Add(sizeof(float) * partial_rows);
  l.partial_acc = dev.Add(sizeof(float) * partial_rows * dims_.kv_lora_rank);
  l.device_bytes = dev.total();
  return l;
}

absl::Status CudaMlaLayer::Stage(const Tensor& hidden, const BatchPlan& plan,
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

absl::StatusOr<Tensor> CudaMlaLayer::Launch(const BatchPlan& plan, const FlashInferCall& fi,
                                            const CallLayout& l, int64_t rows, bool decode) {
  std::byte* host = staging_.data();
  auto* device = static_cast<std::byte*>(workspace_.data());
  auto dptr = [&](const Section& section) { return device + section.offset; };
  auto fptr = [&](const Section& section) { return reinterpret_cast<float*>(dptr(section)); };
  const int m_rows = static_cast<int>(rows);

  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device, host, l.upload_bytes, cudaMemcpyHostToDevice, stream_),
      "uploading the batch");
  if (context_.pool->poison()) {
    const size_t begin = l.x_act.offset, end = l.device_bytes;
    ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device + begin, 0xFF, end - begin, stream_),
                                   "poisoning the workspace");
  }
  // The input from the wire dtype to the activation dtype, and back for the projections' inputs.
  const void* x = dptr(l.x);
  if (l.wire != activation_) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertActivations(x, ToKvType(l.wire), dptr(l.x_act), ToKvType(activation_),
                                 rows * spec_.d_model, stream_),
        "input to the activation dtype");
    x = dptr(l.x_act);
  }
  // A projection's fp32 input in the activation dtype: itself (fp32), or converted into `narrow`.
  auto projection_input = [&](const Section& wide,
                              const Section& narrow) -> absl::StatusOr<const void*> {
    if (activation_ == DType::kF32) return static_cast<const void*>(dptr(wide));
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertFloats(fptr(wide), ToKvType(activation_), dptr(narrow),
                            static_cast<int64_t>(wide.bytes / sizeof(float)), stream_),
        "a projection's input to the activation dtype");
    return static_cast<const void*>(dptr(narrow));
  };
  const bool q_lora = dims_.q_lora_rank > 0;
  // q_a = x Wq_a^T (or q = x Wq^T), latent = x Wkv_a^T.
  if (absl::Status s = q_proj_.Run(*context_.cublas, cublas_, stream_, x, m_rows,
                                   q_lora ? fptr(l.q_a) : fptr(l.q));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          kv_a_proj_.Run(*context_.cublas, cublas_, stream_, x, m_rows, fptr(l.latent));
      !s.ok()) {
    return s;
  }
  MlaRope rope;
  rope.inv_freq = static_cast<const double*>(inv_freq_.data());
  rope.rotary = spec_.rope == RopeLayout::kNone ? 0 : dims_.qk_rope_head_dim;
  rope.interleaved = spec_.rope == RopeLayout::kInterleaved ? 1 : 0;
  const MlaPagedKv kv{sequences_.store().pool_base(),
                      reinterpret_cast<const int64_t*>(dptr(l.pages)), kv_config_.page_size,
                      dims_.kv_lora_rank, dims_.qk_rope_head_dim};
  // Norms, RoPE(k_pe), [c | k_pe] -> pages.
  MlaAppendParams append;
  append.q_latent = q_lora ? fptr(l.q_a) : nullptr;
  append.q_norm = static_cast<const float*>(q_norm_.data());
  append.q_lora = dims_.q_lora_rank;
  append.latent = fptr(l.latent);
  append.kv_norm = static_cast<const float*>(kv_norm_.data());
  append.eps = dims_.rms_norm_eps;
  append.positions = reinterpret_cast<const int64_t*>(dptr(l.positions));
  append.row_sequence = reinterpret_cast<const int*>(dptr(l.row_sequence));
  append.sequences = reinterpret_cast<const SequenceDesc*>(dptr(l.sequences));
  append.rope = rope;
  append.rows = m_rows;
  append.kv_type = ToKvType(kv_config_.storage.element);
  append.kv = kv;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchMlaAppend(append, stream_), "MLA latent append launch");
  // q = RMSNorm(q_a) Wq_b^T.
  if (q_lora) {
    const absl::StatusOr<const void*> q_a = projection_input(l.q_a, l.q_a16);
    if (!q_a.ok()) return q_a.status();
    if (absl::Status s = q_b_proj_.Run(*context_.cublas, cublas_, stream_, *q_a, m_rows, fptr(l.q));
        !s.ok()) {
      return s;
    }
  }
  // q_lat = [q_nope W_UK | RoPE(q_pe)].
  MlaQueryParams query;
  query.q = fptr(l.q);
  query.w_uk = static_cast<const float*>(w_kv_b_.data());
  query.w_uk_head_stride = int64_t{kv_b_width_} * dims_.kv_lora_rank;
  query.q_latent = fptr(l.q_lat);
  query.positions = append.positions;
  query.rope = rope;
  query.rows = m_rows;
  query.num_heads = spec_.num_heads;
  query.nope = dims_.qk_nope_head_dim;
  query.rope_dim = dims_.qk_rope_head_dim;
  query.latent = dims_.kv_lora_rank;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchMlaQuery(query, stream_), "MLA absorbed query launch");

  if (absl::Status s = RunAttention(plan, fi, l, rows, decode); !s.ok()) return s;

  // attn = o_lat W_UV^T, out = attn Wo^T.
  MlaOutputParams output;
  if (fi.has_value()) {
    output.o_latent_bf16 = dptr(l.o16);
  } else {
    output.o_latent = fptr(l.o_lat);
  }
  output.w_uv_t = static_cast<const float*>(w_uv_t_.data());
  output.out = fptr(l.attn);
  output.rows = m_rows;
  output.num_heads = spec_.num_heads;
  output.latent = dims_.kv_lora_rank;
  output.v = dims_.v_head_dim;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchMlaOutput(output, stream_), "MLA W_UV launch");
  const absl::StatusOr<const void*> attn = projection_input(l.attn, l.attn16);
  if (!attn.ok()) return attn.status();
  if (absl::Status s = o_proj_.Run(*context_.cublas, cublas_, stream_, *attn, m_rows, fptr(l.out));
      !s.ok()) {
    return s;
  }
  // The first element that is not finite once in the wire dtype, as CudaGqaLayer::Launch.
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
  const Section& download = l.download();
  std::byte* host_out = host + l.upload_bytes;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_out, dptr(download), download.bytes, cudaMemcpyDeviceToHost, stream_),
      "downloading the output");
  auto* host_first_bad = reinterpret_cast<unsigned long long*>(host_out + AlignUp(download.bytes));
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_first_bad, first_bad, sizeof(*first_bad),
                                                 cudaMemcpyDeviceToHost, stream_),
                                 "downloading the finiteness flag");
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "running the batch");
  Tensor out(l.wire, {rows, spec_.d_model});
  if (*host_first_bad != ~0ULL) {
    return NonFiniteOutputError(out, static_cast<int64_t>(*host_first_bad));
  }
  std::memcpy(out.data(), host_out, download.bytes);
  return out;
}

absl::Status CudaMlaLayer::RunAttention(const BatchPlan& plan, const FlashInferCall& fi,
                                        const CallLayout& l, int64_t rows, bool decode) {
  auto* device = static_cast<std::byte*>(workspace_.data());
  auto dptr = [&](const Section& section) { return device + section.offset; };
  auto fptr = [&](const Section& section) { return reinterpret_cast<float*>(dptr(section)); };
  if (fi.has_value()) {
    // FlashInfer reads bf16 queries; one kernel serves decode and prefill chunks alike.
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertFloats(fptr(l.q_lat), KvType::kBF16, dptr(l.q16),
                            rows * spec_.num_heads * row_width_, stream_),
        "absorbed queries to bf16");
    return flashinfer_->Launch(*fi, reinterpret_cast<const int32_t*>(dptr(l.flashinfer_words)),
                               sequences_.store().pool_base(), dptr(l.q16), dptr(l.o16),
                               dptr(l.flashinfer_scratch), stream_);
  }
  MlaAttentionParams attn;
  attn.q = fptr(l.q_lat);
  attn.out = fptr(l.o_lat);
  attn.num_heads = spec_.num_heads;
  attn.scale = EffectiveSoftmaxScale(spec_);
  attn.mask = PlanShape().mask;
  attn.kv =
      MlaPagedKv{sequences_.store().pool_base(), reinterpret_cast<const int64_t*>(dptr(l.pages)),
                 kv_config_.page_size, dims_.kv_lora_rank, dims_.qk_rope_head_dim};
  attn.sequences = reinterpret_cast<const SequenceDesc*>(dptr(l.sequences));
  attn.batch = static_cast<int>(plan.sequences.size());
  attn.items = reinterpret_cast<const WorkItem*>(dptr(l.items));
  attn.num_items = static_cast<int>(plan.items.size());
  if (!decode) return RunMlaPrefillAttention(kv_config_.storage.element, attn, stream_);
  attn.partial_max = fptr(l.partial_max);
  attn.partial_sum = fptr(l.partial_sum);
  attn.partial_acc = fptr(l.partial_acc);
  attn.item_begin = reinterpret_cast<const int*>(dptr(l.item_begin));
  return RunMlaDecodeAttention(kv_config_.storage.element, attn, stream_);
}

}  // namespace attnserve::cuda

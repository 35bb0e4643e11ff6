#include "kernels/cuda/cuda_layer.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/work_plan.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/layer_input_checks.h"
#include "kernels/rope_frequencies.h"

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

std::vector<float> FloatsOrEmpty(const LayerWeights& weights, const std::string& name) {
  auto it = weights.find(name);
  return it == weights.end() ? std::vector<float>() : it->second.ToFloats();
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
      compute_(kv_config.dtype),
      sequences_(kv_config.page_size, page_bytes, kv_config.max_pages, kv_config.budget,
                 spec.causal, spec.sliding_window),
      store_(context.pool, page_bytes) {}

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
  const int64_t page_bytes = KvBytesPerToken(spec, kv_config.dtype) * kv_config.page_size;
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
  if (absl::Status s = qkv_proj_.Init(wqkv, bqkv, qkv_width_, spec_.d_model, compute_); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          o_proj_.Init(weights.at("o_proj.weight").ToFloats(),
                       spec_.o_bias ? FloatsOrEmpty(weights, "o_proj.bias") : std::vector<float>(),
                       spec_.d_model, q_width_, compute_);
      !s.ok()) {
    return s;
  }
  const int rotary = spec_.rope == RopeLayout::kNone ? 0 : RotaryDim(spec_);
  if (rotary > 0) {
    // The CPU RotaryEmbedding's frequencies (rope scaling included), in fp64. Its cos/sin factor
    // has no place in the kernel: CudaBackend::CreateLayer refuses specs where it is not 1.
    const std::vector<double> inv_freq = RopeInverseFrequencies(spec_);
    if (absl::Status s = inv_freq_.EnsureBytes(inv_freq.size() * sizeof(double)); !s.ok()) return s;
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(inv_freq_.data(), inv_freq.data(), inv_freq.size() * sizeof(double),
                   cudaMemcpyHostToDevice),
        "uploading RoPE frequencies");
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
  return qkv_proj_.parameter_bytes() + o_proj_.parameter_bytes();
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

absl::Status CudaGqaLayer::CommitPages(absl::Span<const int32_t> pages) {
  if (absl::Status s = store_.Commit(pages); !s.ok()) return s;
  if (!context_.pool->poison()) return absl::OkStatus();
  for (int32_t page : pages) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(static_cast<char*>(store_.pool_base()) + store_.PageOffset(page), 0xFF,
                        static_cast<size_t>(store_.page_bytes()), stream_),
        "poisoning new KV pages");
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CudaGqaLayer::Run(const Tensor& hidden, absl::Span<const SequenceId> ids,
                                         absl::Span<const int64_t> counts,
                                         absl::Span<const int64_t> positions, bool decode) {
  int64_t rows = 0;
  for (int64_t count : counts) rows += count;
  if (absl::Status s = CheckHiddenShape(spec_, hidden, rows); !s.ok()) return s;
  if (absl::Status s = CheckPositions(positions, rows); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(context_.device), "cudaSetDevice");
  // An earlier failed call may have left a non-sticky error behind, which this call's launch
  // checks (cudaGetLastError) would report as their own: clear it. A sticky error (a kernel
  // fault) cannot be cleared and fails every later call, as it must.
  (void)cudaGetLastError();
  std::vector<BatchSequence> batch;
  if (absl::Status s = sequences_.Reserve(
          ids, counts, [this](absl::Span<const int32_t> pages) { return CommitPages(pages); },
          batch);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<Tensor> out = Compute(hidden, batch, positions, decode);
  if (out.ok()) {
    if (absl::Status s = CheckOutputFinite(*out); !s.ok()) out = s;
  }
  if (!out.ok()) {
    sequences_.Rollback(batch);
    return out.status();
  }
  for (const BatchSequence& seq : batch) sequences_.EvictOutsideWindow(*seq.table);
  return out;
}

absl::StatusOr<Tensor> CudaGqaLayer::Compute(const Tensor& hidden,
                                             const std::vector<BatchSequence>& batch,
                                             absl::Span<const int64_t> positions, bool decode) {
  const int64_t rows = hidden.dim(0);
  const int num_seqs = static_cast<int>(batch.size());
  const int heads = spec_.num_heads, kv_heads = spec_.num_kv_heads, head_dim = spec_.head_dim;
  const int group = heads / kv_heads;
  const int row_blocks = (group + kAttentionRowsPerBlock - 1) / kAttentionRowsPerBlock;
  const MaskSpec mask{spec_.causal ? 1 : 0, spec_.sliding_window};
  const int prefill_rows = PrefillRowsPerBlock(kv_config_.dtype);
  if (rows > INT_MAX / std::max(qkv_width_, spec_.d_model)) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", rows, " rows is too large"));
  }

  // ---- Plan on the host ---------------------------------------------------------------------
  std::vector<int64_t> resolved(static_cast<size_t>(rows));
  std::vector<int> row_sequence(static_cast<size_t>(rows));
  std::vector<SequenceDesc> descs;
  std::vector<int64_t> page_offsets;
  std::vector<WorkItem> items;
  std::vector<int> item_begin;
  const int64_t wanted_splits =
      DecodeSplitsForTwoWaves(num_seqs, kv_heads, row_blocks, context_.multiprocessors);
  for (int b = 0; b < num_seqs; ++b) {
    const BatchSequence& seq = batch[b];
    const PageTable& table = *seq.table;
    if (table.num_tokens > INT_MAX) {
      return absl::InvalidArgumentError("sequence longer than 2^31 - 1 tokens");
    }
    SequenceDesc desc;
    desc.first_row = static_cast<int>(seq.first_row);
    desc.num_new = static_cast<int>(seq.num_new);
    desc.first_index = static_cast<int>(seq.first_index);
    desc.length = static_cast<int>(table.num_tokens);
    desc.first_page = static_cast<int>(page_offsets.size());
    descs.push_back(desc);
    for (int32_t page : table.pages) {
      page_offsets.push_back(page == kEvictedPage ? -1 : store_.PageOffset(page));
    }
    for (int64_t i = 0; i < seq.num_new; ++i) {
      resolved[seq.first_row + i] =
          positions.empty() ? seq.first_index + i : positions[seq.first_row + i];
      row_sequence[seq.first_row + i] = b;
    }
    item_begin.push_back(static_cast<int>(items.size()));
    if (decode) {
      PlanDecodeSplits(desc, b, mask, wanted_splits, kDecodeMinKeysPerSplit, items);
    } else {
      PlanPrefillItems(desc, b, group, mask, prefill_rows, items);
    }
  }
  item_begin.push_back(static_cast<int>(items.size()));
  const int num_items = static_cast<int>(items.size());

  // ---- Workspace: [upload | activations | partials]; staging: [upload | output] ----------------
  SectionLayout up;
  const size_t compute_bytes = DTypeSize(compute_);
  const Section s_x = up.Add(compute_bytes * rows * spec_.d_model);
  const Section s_pos = up.Add(sizeof(int64_t) * rows);
  const Section s_rowseq = up.Add(sizeof(int) * rows);
  const Section s_desc = up.Add(sizeof(SequenceDesc) * descs.size());
  const Section s_pages = up.Add(sizeof(int64_t) * std::max<size_t>(1, page_offsets.size()));
  const Section s_items = up.Add(sizeof(WorkItem) * items.size());
  const Section s_ibegin = up.Add(sizeof(int) * item_begin.size());
  const size_t upload_bytes = up.total();
  SectionLayout dev = up;
  const Section s_qkv = dev.Add(sizeof(float) * rows * qkv_width_);
  const Section s_attn = dev.Add(sizeof(float) * rows * q_width_);
  // The attention output in the compute dtype, when the output projection reads 16-bit.
  const Section s_attn16 = dev.Add(compute_ == DType::kF32 ? 0 : compute_bytes * rows * q_width_);
  const Section s_out = dev.Add(sizeof(float) * rows * spec_.d_model);
  const int64_t partial_rows = decode ? int64_t{num_items} * heads : 0;
  const Section s_pmax = dev.Add(sizeof(float) * partial_rows);
  const Section s_psum = dev.Add(sizeof(float) * partial_rows);
  const Section s_pacc = dev.Add(sizeof(float) * partial_rows * head_dim);
  if (absl::Status s = workspace_.EnsureBytes(dev.total()); !s.ok()) return s;
  if (absl::Status s = staging_.EnsureBytes(upload_bytes + AlignUp(s_out.bytes)); !s.ok()) {
    return s;
  }
  std::byte* host = staging_.data();
  auto* device = static_cast<std::byte*>(workspace_.data());
  auto put = [&](const Section& section, const void* src) {
    if (section.bytes > 0) std::memcpy(host + section.offset, src, section.bytes);
  };
  if (hidden.dtype() == compute_) {
    put(s_x, hidden.data());
  } else {
    const Tensor x = hidden.CastTo(compute_);
    put(s_x, x.data());
  }
  put(s_pos, resolved.data());
  put(s_rowseq, row_sequence.data());
  put(s_desc, descs.data());
  if (!page_offsets.empty()) put(s_pages, page_offsets.data());
  put(s_items, items.data());
  put(s_ibegin, item_begin.data());
  auto dptr = [&](const Section& section) { return device + section.offset; };
  auto fptr = [&](const Section& section) { return reinterpret_cast<float*>(dptr(section)); };

  // ---- Run on the stream ----------------------------------------------------------------------
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device, host, upload_bytes, cudaMemcpyHostToDevice, stream_),
      "uploading the batch");
  if (context_.pool->poison()) {
    const size_t begin = s_qkv.offset, end = dev.total();
    ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device + begin, 0xFF, end - begin, stream_),
                                   "poisoning the workspace");
  }
  const int m_rows = static_cast<int>(rows);
  if (absl::Status s =
          qkv_proj_.Run(*context_.cublas, cublas_, stream_, dptr(s_x), m_rows, fptr(s_qkv));
      !s.ok()) {
    return s;
  }
  PagedKv kv;
  kv.pool = store_.pool_base();
  kv.page_offsets = reinterpret_cast<const int64_t*>(dptr(s_pages));
  kv.page_size = kv_config_.page_size;
  kv.num_kv_heads = kv_heads;
  kv.head_dim = head_dim;
  const auto* d_descs = reinterpret_cast<const SequenceDesc*>(dptr(s_desc));

  RopeAppendParams rope;
  rope.qkv = fptr(s_qkv);
  rope.qkv_stride = qkv_width_;
  rope.positions = reinterpret_cast<const int64_t*>(dptr(s_pos));
  rope.row_sequence = reinterpret_cast<const int*>(dptr(s_rowseq));
  rope.sequences = d_descs;
  rope.inv_freq = static_cast<const double*>(inv_freq_.data());
  rope.rows = m_rows;
  rope.num_heads = heads;
  rope.rotary_dim = spec_.rope == RopeLayout::kNone ? 0 : RotaryDim(spec_);
  rope.interleaved = spec_.rope == RopeLayout::kInterleaved ? 1 : 0;
  rope.kv_type = ToKvType(kv_config_.dtype);
  rope.kv = kv;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchRopeAppend(rope, stream_), "RoPE + KV append launch");

  AttentionParams attn;
  attn.q = fptr(s_qkv);
  attn.q_stride = qkv_width_;
  attn.out = fptr(s_attn);
  attn.num_heads = heads;
  attn.group = group;
  attn.scale = EffectiveSoftmaxScale(spec_);
  attn.mask = mask;
  attn.kv = kv;
  attn.sequences = d_descs;
  attn.batch = num_seqs;
  attn.items = reinterpret_cast<const WorkItem*>(dptr(s_items));
  attn.num_items = num_items;
  if (decode) {
    attn.partial_max = fptr(s_pmax);
    attn.partial_sum = fptr(s_psum);
    attn.partial_acc = fptr(s_pacc);
    attn.item_begin = reinterpret_cast<const int*>(dptr(s_ibegin));
    if (absl::Status s = RunDecodeAttention(kv_config_.dtype, head_dim, attn, row_blocks, stream_);
        !s.ok()) {
      return s;
    }
  } else if (absl::Status s = RunPrefillAttention(kv_config_.dtype, head_dim, attn, stream_);
             !s.ok()) {
    return s;
  }

  // out[rows, d_model] = attn . Wo^T (+ bias)
  const void* attn_in = fptr(s_attn);
  if (compute_ != DType::kF32) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertFloats(fptr(s_attn), ToKvType(compute_), dptr(s_attn16),
                            int64_t{rows} * q_width_, stream_),
        "attention output to the compute dtype");
    attn_in = dptr(s_attn16);
  }
  if (absl::Status s =
          o_proj_.Run(*context_.cublas, cublas_, stream_, attn_in, m_rows, fptr(s_out));
      !s.ok()) {
    return s;
  }
  std::byte* host_out = host + upload_bytes;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_out, dptr(s_out), s_out.bytes, cudaMemcpyDeviceToHost, stream_),
      "downloading the output");
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "running the batch");

  Tensor out(DType::kF32, {rows, spec_.d_model});
  std::memcpy(out.data(), host_out, s_out.bytes);
  return out.CastTo(hidden.dtype());
}

}  // namespace attnserve::cuda

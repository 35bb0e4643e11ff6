#include "kernels/cuda/layer/cuda_mla_layer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/mla/mla_dispatch.h"
#include "kernels/cuda/mla/mla_params.h"
#include "kernels/cuda/runtime/cuda_status.h"
#include "kernels/kv/quantization.h"
#include "kernels/spec/rope_frequencies.h"

namespace attnserve::cuda {

namespace {

absl::Status UploadFloats(DeviceBuffer& buffer, const std::vector<float>& host, const char* what) {
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
    : CudaLayerBase(spec, kv_config, context, page_bytes),
      dims_(spec.mla),
      qk_dim_(spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim),
      row_width_(spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim),
      kv_b_width_(spec.mla.qk_nope_head_dim + spec.mla.v_head_dim),
      // As CudaGqaLayer's: fp32 with f32 pages, the pages' 16-bit type with 16-bit pages, fp32
      // with 8-bit pages (their element is f32), so both backends quantize the same latent.
      activation_(kv_config.storage.element) {}

absl::StatusOr<std::unique_ptr<AttentionLayer>> CudaMlaLayer::Create(const LayerSpec& spec,
                                                                     const LayerWeights& weights,
                                                                     const KvCacheConfig& kv_config,
                                                                     const CudaContext& context) {
  if (absl::Status s = CheckMlaKernelDims(spec.mla.kv_lora_rank, spec.mla.qk_rope_head_dim,
                                          spec.mla.qk_nope_head_dim);
      !s.ok()) {
    return s;
  }
  const absl::StatusOr<int64_t> page_bytes = PageBytes(spec, kv_config, context);
  if (!page_bytes.ok()) return page_bytes.status();
  std::unique_ptr<CudaMlaLayer> layer(new CudaMlaLayer(spec, kv_config, context, *page_bytes));
  if (absl::Status s = layer->Init(weights); !s.ok()) return s;
  return std::unique_ptr<AttentionLayer>(std::move(layer));
}

absl::Status CudaMlaLayer::Init(const LayerWeights& weights) {
  if (absl::Status s = InitDevice(); !s.ok()) return s;
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
    if (absl::Status s = UploadFloats(q_norm_, weights.at("q_a_layernorm.weight").ToFloats(),
                                      "uploading q_a_norm");
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
  if (absl::Status s = UploadFloats(kv_norm_, weights.at("kv_a_layernorm.weight").ToFloats(),
                                    "uploading kv_a_norm");
      !s.ok()) {
    return s;
  }
  // kv_b_proj [H * (nope + v), kv_lora]: W_UK_h is read in place (rows h(nope+v) .. +nope); W_UV_h
  // (the next v rows) is transposed to [kv_lora, v] so the output kernel reads it coalesced.
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
  if (absl::Status s = UploadFloats(w_kv_b_, kv_b, "uploading kv_b_proj"); !s.ok()) return s;
  if (absl::Status s = UploadFloats(w_uv_t_, uv_t, "uploading W_UV"); !s.ok()) return s;
  if (context_.attention == CudaAttentionImpl::kFlashInfer &&
      FlashInferMlaAttention::Serves(spec_, kv_config_, context_.pool->capacity_bytes())) {
    flashinfer_ =
        FlashInferMlaAttention::Create(spec_, kv_config_, pages_.store().page_bytes(),
                                       context_.pool->slab_bytes(), context_.multiprocessors);
  }
  if (variation_.rope.active()) {
    // The CPU layer's frequencies (YaRN included), in fp64. The capability table refuses specs
    // whose cos/sin factor is not 1, so the kernels' multiply by it (RotaryPositions) is exact.
    const std::vector<double> inv_freq = RopeInverseFrequencies(spec_);
    if (absl::Status s = inv_freq_.EnsureBytes(inv_freq.size() * sizeof(double)); !s.ok()) return s;
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(inv_freq_.data(), inv_freq.data(), inv_freq.size() * sizeof(double),
                   cudaMemcpyHostToDevice),
        "uploading RoPE frequencies");
  }
  plan_shape_ = PlanShape();
  widest_row_ =
      std::max<int64_t>({spec_.d_model, int64_t{spec_.num_heads} * std::max(qk_dim_, row_width_)});
  return absl::OkStatus();
}

int64_t CudaMlaLayer::ParameterBytes() const {
  return q_proj_.parameter_bytes() + q_b_proj_.parameter_bytes() + kv_a_proj_.parameter_bytes() +
         o_proj_.parameter_bytes() +
         static_cast<int64_t>(sizeof(float)) *
             (dims_.q_lora_rank + dims_.kv_lora_rank +
              int64_t{spec_.num_heads} * kv_b_width_ * dims_.kv_lora_rank +
              int64_t{spec_.num_heads} * dims_.kv_lora_rank * dims_.v_head_dim);
}

// Where one call's buffers sit: the upload region (input and plan, one copy from the pinned staging
// buffer), then the activations and the split-KV partials, then the output.
struct CudaMlaLayer::CallLayout : LayerCall {
  FlashInferCall fi;
  // FlashInfer only: q16 the absorbed queries in bf16, o16 its bf16 output, scratch its partials.
  Section q16, o16, flashinfer_scratch;
  //   x_act: [rows, d_model] the input in the activation dtype, when the wire's differs;
  //   q_a: [rows, q_lora] (q_lora_rank > 0); latent: [rows, kv_lora + rope]; q: [rows, H, qk];
  //   q_lat: [rows, H, kv_lora + rope]; o_lat: [rows, H, kv_lora]; attn: [rows, H * v];
  //   q_a16, attn16: q_a (normalised) and attn in the activation dtype (16-bit projections).
  Section x_act, q_a, q_a16, latent, q, q_lat, o_lat, attn, attn16, partial_max, partial_sum,
      partial_acc;
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

absl::StatusOr<std::unique_ptr<CudaLayerBase::LayerCall>> CudaMlaLayer::LayOutCall(
    const BatchPlan& plan, int64_t rows, bool decode, DType wire) const {
  auto call = std::make_unique<CallLayout>();
  CallLayout& l = *call;
  if (flashinfer_.has_value()) {
    absl::StatusOr<FlashInferMlaAttention::CallPlan> fi_plan = flashinfer_->Plan(plan);
    if (!fi_plan.ok()) return fi_plan.status();
    l.fi = *std::move(fi_plan);
    l.flashinfer_words = l.fi->words;
  }
  const FlashInferCall& fi = l.fi;
  const int64_t heads = spec_.num_heads;
  const size_t activation_bytes = DTypeSize(activation_);
  const bool narrow = activation_ != DType::kF32;  // 16-bit projections.
  SectionLayout dev;
  // The input goes up in the caller's dtype and the output comes down in it, both converted on the
  // device, as CudaGqaLayer::LayOut.
  l.up = UploadSections::LayOut(plan, rows, spec_.d_model, wire,
                                fi.has_value() ? fi->words.size() : 0, dev);
  l.x_act = dev.Add(wire == activation_ ? 0 : activation_bytes * rows * spec_.d_model);
  l.q_a = dev.Add(sizeof(float) * rows * dims_.q_lora_rank);
  l.q_a16 = dev.Add(narrow ? activation_bytes * rows * dims_.q_lora_rank : 0);
  l.latent = dev.Add(sizeof(float) * rows * row_width_);
  l.q = dev.Add(sizeof(float) * rows * heads * qk_dim_);
  l.q_lat = dev.Add(sizeof(float) * rows * heads * row_width_);
  l.o_lat = dev.Add(fi.has_value() ? 0 : sizeof(float) * rows * heads * dims_.kv_lora_rank);
  l.attn = dev.Add(sizeof(float) * rows * heads * dims_.v_head_dim);
  l.attn16 = dev.Add(narrow ? activation_bytes * rows * heads * dims_.v_head_dim : 0);
  l.q16 = dev.Add(fi.has_value() ? 2 * rows * heads * row_width_ : 0);
  l.o16 = dev.Add(fi.has_value() ? 2 * rows * heads * dims_.kv_lora_rank : 0);
  l.flashinfer_scratch = dev.Add(fi.has_value() ? fi->scratch_bytes : 0);
  const int64_t partial_rows =
      decode && !fi.has_value() ? static_cast<int64_t>(plan.items.size()) * heads : 0;
  l.partial_max = dev.Add(sizeof(float) * partial_rows);
  l.partial_sum = dev.Add(sizeof(float) * partial_rows);
  l.partial_acc = dev.Add(sizeof(float) * partial_rows * dims_.kv_lora_rank);
  l.o = OutputSections::LayOut(rows, spec_.d_model, wire, dev);
  l.device_bytes = dev.total();
  return call;
}

absl::StatusOr<Tensor> CudaMlaLayer::Launch(const BatchPlan& plan, const LayerCall& call,
                                            int64_t rows, bool decode) {
  const CallLayout& l = static_cast<const CallLayout&>(call);
  const FlashInferCall& fi = l.fi;
  const int m_rows = static_cast<int>(rows);
  const absl::StatusOr<const void*> input =
      Upload(l.up, l.device_bytes, l.o.wire, activation_, l.x_act, rows);
  if (!input.ok()) return input.status();
  const void* x = *input;
  // A projection's fp32 input in the activation dtype: itself (fp32), or converted into `narrow`.
  auto projection_input = [&](const Section& wide,
                              const Section& narrow) -> absl::StatusOr<const void*> {
    if (activation_ == DType::kF32) return static_cast<const void*>(device(wide));
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertFloats(device_floats(wide), ToKvType(activation_), device(narrow),
                            static_cast<int64_t>(wide.bytes / sizeof(float)), stream_),
        "a projection's input to the activation dtype");
    return static_cast<const void*>(device(narrow));
  };
  const bool q_lora = dims_.q_lora_rank > 0;
  // q_a = x Wq_a^T (or q = x Wq^T), latent = x Wkv_a^T.
  if (absl::Status s = q_proj_.Run(*context_.cublas, cublas_, stream_, x, m_rows,
                                   q_lora ? device_floats(l.q_a) : device_floats(l.q));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          kv_a_proj_.Run(*context_.cublas, cublas_, stream_, x, m_rows, device_floats(l.latent));
      !s.ok()) {
    return s;
  }
  timer_.EndDevice(LayerStage::kQkvGemm, stream_);
  RotaryPositions rope = variation_.rope;  // Layout and rotary dims, as the CPU's.
  rope.inv_freq = static_cast<const double*>(inv_freq_.data());
  const MlaPagedKv kv{pages_.store().pool_base(),
                      reinterpret_cast<const int64_t*>(device(l.up.pages)), kv_config_.page_size,
                      dims_.kv_lora_rank, dims_.qk_rope_head_dim};
  // Norms, RoPE(k_pe), [c | k_pe] -> pages.
  MlaAppendParams append;
  append.q_latent = q_lora ? device_floats(l.q_a) : nullptr;
  append.q_norm = static_cast<const float*>(q_norm_.data());
  append.q_lora = dims_.q_lora_rank;
  append.latent = device_floats(l.latent);
  append.kv_norm = static_cast<const float*>(kv_norm_.data());
  append.eps = dims_.rms_norm_eps;
  append.positions = reinterpret_cast<const int64_t*>(device(l.up.positions));
  append.row_sequence = reinterpret_cast<const int*>(device(l.up.row_sequence));
  append.sequences = reinterpret_cast<const SequenceDesc*>(device(l.up.sequences));
  append.rope = rope;
  append.rows = m_rows;
  append.batch = static_cast<int>(plan.sequences.size());
  append.kv_type = ToKvType(kv_config_.storage);
  append.kv = kv;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchMlaAppend(append, stream_), "MLA latent append launch");
  // q = RMSNorm(q_a) Wq_b^T.
  if (q_lora) {
    const absl::StatusOr<const void*> q_a = projection_input(l.q_a, l.q_a16);
    if (!q_a.ok()) return q_a.status();
    if (absl::Status s =
            q_b_proj_.Run(*context_.cublas, cublas_, stream_, *q_a, m_rows, device_floats(l.q));
        !s.ok()) {
      return s;
    }
  }
  // q_lat = [q_nope W_UK | RoPE(q_pe)].
  MlaQueryParams query;
  query.q = device_floats(l.q);
  query.w_uk = static_cast<const float*>(w_kv_b_.data());
  query.w_uk_head_stride = int64_t{kv_b_width_} * dims_.kv_lora_rank;
  query.q_latent = device_floats(l.q_lat);
  query.positions = append.positions;
  query.rope = rope;
  query.rows = m_rows;
  query.num_heads = spec_.num_heads;
  query.nope = dims_.qk_nope_head_dim;
  query.rope_dim = dims_.qk_rope_head_dim;
  query.latent = dims_.kv_lora_rank;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchMlaQuery(query, stream_), "MLA absorbed query launch");
  // The rope_append stage of MLA: the latent append, q_b_proj and the absorbed query.
  timer_.EndDevice(LayerStage::kRopeAppend, stream_);

  if (absl::Status s = RunAttention(plan, fi, l, rows, decode); !s.ok()) return s;
  timer_.EndDevice(LayerStage::kAttention, stream_);

  // attn = o_lat W_UV^T, out = attn Wo^T.
  MlaOutputParams output;
  if (fi.has_value()) {
    output.o_latent_bf16 = device(l.o16);
  } else {
    output.o_latent = device_floats(l.o_lat);
  }
  output.w_uv_t = static_cast<const float*>(w_uv_t_.data());
  output.out = device_floats(l.attn);
  output.rows = m_rows;
  output.num_heads = spec_.num_heads;
  output.latent = dims_.kv_lora_rank;
  output.v = dims_.v_head_dim;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchMlaOutput(output, stream_), "MLA W_UV launch");
  const absl::StatusOr<const void*> attn = projection_input(l.attn, l.attn16);
  if (!attn.ok()) return attn.status();
  if (absl::Status s =
          o_proj_.Run(*context_.cublas, cublas_, stream_, *attn, m_rows, device_floats(l.o.out));
      !s.ok()) {
    return s;
  }
  return Download(l.o, l.up.bytes, rows);
}

absl::Status CudaMlaLayer::RunAttention(const BatchPlan& plan, const FlashInferCall& fi,
                                        const CallLayout& l, int64_t rows, bool decode) {
  if (fi.has_value()) {
    // FlashInfer reads bf16 queries; one kernel serves decode and prefill chunks alike.
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertFloats(device_floats(l.q_lat), KvType::kBF16, device(l.q16),
                            rows * spec_.num_heads * row_width_, stream_),
        "absorbed queries to bf16");
    return flashinfer_->Launch(*fi, reinterpret_cast<const int32_t*>(device(l.up.flashinfer_words)),
                               pages_.store().pool_base(), device(l.q16), device(l.o16),
                               device(l.flashinfer_scratch), stream_);
  }
  MlaAttentionParams attn;
  attn.q = device_floats(l.q_lat);
  attn.out = device_floats(l.o_lat);
  attn.num_heads = spec_.num_heads;
  attn.scale = variation_.scale;
  attn.mask = plan_shape_.mask;
  attn.kv =
      MlaPagedKv{pages_.store().pool_base(), reinterpret_cast<const int64_t*>(device(l.up.pages)),
                 kv_config_.page_size, dims_.kv_lora_rank, dims_.qk_rope_head_dim};
  attn.sequences = reinterpret_cast<const SequenceDesc*>(device(l.up.sequences));
  attn.batch = static_cast<int>(plan.sequences.size());
  attn.items = reinterpret_cast<const WorkItem*>(device(l.up.items));
  attn.num_items = static_cast<int>(plan.items.size());
  if (!decode) return RunMlaPrefillAttention(kv_config_.storage, attn, stream_);
  attn.partial_max = device_floats(l.partial_max);
  attn.partial_sum = device_floats(l.partial_sum);
  attn.partial_acc = device_floats(l.partial_acc);
  attn.item_begin = reinterpret_cast<const int*>(device(l.up.item_begin));
  return RunMlaDecodeAttention(kv_config_.storage, attn, stream_);
}

}  // namespace attnserve::cuda

#include "kernels/cuda/layer/cuda_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/runtime/cuda_status.h"
#include "kernels/kv/quantization.h"
#include "kernels/spec/rope_frequencies.h"

namespace attnserve::cuda {

namespace {
// The dtype the projections (weights and inputs) run in, chosen once from how the pages are stored
// and never read off them again: fp32 with f32 pages (the GPU then tracks the CPU engine to fp32
// rounding), the pages' 16-bit type with 16-bit pages (tensor cores, fp32 accumulation). 8-bit
// pages (element f32: what their codes dequantize to) compute in fp32, as the CPU engine does with
// them, so both quantize the same K/V values.
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
    : CudaLayerBase(spec, kv_config, context, page_bytes),
      q_width_(spec.num_heads * spec.head_dim),
      kv_width_(spec.num_kv_heads * spec.head_dim),
      qkv_width_(q_width_ + 2 * kv_width_),
      activation_(ActivationDType(kv_config.storage)) {}

absl::StatusOr<std::unique_ptr<AttentionLayer>> CudaGqaLayer::Create(const LayerSpec& spec,
                                                                     const LayerWeights& weights,
                                                                     const KvCacheConfig& kv_config,
                                                                     const CudaContext& context) {
  const absl::StatusOr<int64_t> page_bytes = PageBytes(spec, kv_config, context);
  if (!page_bytes.ok()) return page_bytes.status();
  std::unique_ptr<CudaGqaLayer> layer(new CudaGqaLayer(spec, kv_config, context, *page_bytes));
  if (absl::Status s = layer->Init(weights); !s.ok()) return s;
  return std::unique_ptr<AttentionLayer>(std::move(layer));
}

absl::Status CudaGqaLayer::Init(const LayerWeights& weights) {
  if (absl::Status s = InitDevice(); !s.ok()) return s;
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
        FlashInferAttention::Create(spec_, kv_config_, pages_.store().page_bytes(),
                                    context_.pool->slab_bytes(), context_.pool->capacity_bytes());
    if (!flashinfer.ok()) return flashinfer.status();
    flashinfer_ = *std::move(flashinfer);
  }
  if (variation_.rope.active()) {
    // The CPU layer's frequencies (rope scaling included), in fp64; the rest of the RoPE policy
    // (variation_.rope) goes with each call's RopeAppendParams.
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
  plan_shape_ = PlanShape();
  widest_row_ = std::max(qkv_width_, spec_.d_model);
  return absl::OkStatus();
}

int64_t CudaGqaLayer::ParameterBytes() const {
  // Plus the fp32 q/k norm scales and sinks the kernels read.
  const int64_t small_floats = (spec_.qk_norm != QkNorm::kNone ? 2 * int64_t{spec_.head_dim} : 0) +
                               (spec_.attention_sinks ? int64_t{spec_.num_heads} : 0);
  return qkv_proj_.parameter_bytes() + o_proj_.parameter_bytes() +
         small_floats * static_cast<int64_t>(sizeof(float));
}

// Where one call's buffers sit. The workspace starts with the upload region (the input and the
// plan, copied from the pinned staging buffer in one go), then the activations and the split-KV
// partials, then the output; the staging buffer holds the upload region and then the downloaded
// output.
struct CudaGqaLayer::CallLayout : LayerCall {
  FlashInferCall fi;
  // x_act: the input in the activation dtype, when the wire's differs. FlashInfer: qkv16 is q in
  // the page dtype, flashinfer_scratch its split-KV partials.
  Section x_act, qkv, attn, attn16, qkv16, flashinfer_scratch, partial_max, partial_sum,
      partial_acc;
};

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

absl::StatusOr<std::unique_ptr<CudaLayerBase::LayerCall>> CudaGqaLayer::LayOutCall(
    const BatchPlan& plan, int64_t rows, bool decode, DType wire) const {
  auto call = std::make_unique<CallLayout>();
  CallLayout& l = *call;
  if (flashinfer_.has_value()) {
    absl::StatusOr<FlashInferAttention::CallPlan> fi_plan = flashinfer_->Plan(plan, decode);
    if (!fi_plan.ok()) return fi_plan.status();
    l.fi = *std::move(fi_plan);
    l.flashinfer_words = l.fi->words;
  }
  const FlashInferCall& fi = l.fi;
  SectionLayout dev;
  // Every wire dtype is one the device converts to and from: the input goes up as the caller sent
  // it, the output comes down as the caller reads it, and the host never converts.
  l.up = UploadSections::LayOut(plan, rows, spec_.d_model, wire,
                                fi.has_value() ? fi->words.size() : 0, dev);
  const size_t activation_bytes = DTypeSize(activation_);
  l.x_act = dev.Add(wire == activation_ ? 0 : activation_bytes * rows * spec_.d_model);
  l.qkv = dev.Add(sizeof(float) * rows * qkv_width_);
  l.attn = dev.Add(fi.has_value() ? 0 : sizeof(float) * rows * q_width_);  // Native only.
  // The attention output in the activation dtype, when the output projection reads 16-bit.
  l.attn16 = dev.Add(activation_ == DType::kF32 ? 0 : activation_bytes * rows * q_width_);
  l.qkv16 = dev.Add(fi.has_value() ? activation_bytes * rows * qkv_width_ : 0);
  l.flashinfer_scratch = dev.Add(fi.has_value() ? fi->scratch_bytes : 0);
  // The native decode's split partials (none when FlashInfer computes the attention).
  const int64_t partial_rows =
      decode && !fi.has_value() ? static_cast<int64_t>(plan.items.size()) * spec_.num_heads : 0;
  l.partial_max = dev.Add(sizeof(float) * partial_rows);
  l.partial_sum = dev.Add(sizeof(float) * partial_rows);
  l.partial_acc = dev.Add(sizeof(float) * partial_rows * spec_.head_dim);
  l.o = OutputSections::LayOut(rows, spec_.d_model, wire, dev);
  l.device_bytes = dev.total();
  return call;
}

absl::StatusOr<Tensor> CudaGqaLayer::Launch(const BatchPlan& plan, const LayerCall& call,
                                            int64_t rows, bool decode) {
  const CallLayout& l = static_cast<const CallLayout&>(call);
  const FlashInferCall& fi = l.fi;
  const absl::StatusOr<const void*> x =
      Upload(l.up, l.device_bytes, l.o.wire, activation_, l.x_act, rows);
  if (!x.ok()) return x.status();
  // qkv[rows, q | k | v] = x . [Wq; Wk; Wv]^T (+ bias)
  const int m_rows = static_cast<int>(rows);
  if (absl::Status s =
          qkv_proj_.Run(*context_.cublas, cublas_, stream_, *x, m_rows, device_floats(l.qkv));
      !s.ok()) {
    return s;
  }
  timer_.EndDevice(LayerStage::kQkvGemm, stream_);
  // RoPE(q, k) at the plan's positions; k, v -> pages.
  RopeAppendParams rope;
  rope.qkv = device_floats(l.qkv);
  rope.qkv_stride = qkv_width_;
  rope.positions = reinterpret_cast<const int64_t*>(device(l.up.positions));
  rope.row_sequence = reinterpret_cast<const int*>(device(l.up.row_sequence));
  rope.sequences = reinterpret_cast<const SequenceDesc*>(device(l.up.sequences));
  rope.rope = variation_.rope;  // Layout, rotary dims and cos/sin factor, as the CPU's.
  rope.rope.inv_freq = static_cast<const double*>(inv_freq_.data());
  rope.rows = m_rows;
  rope.num_heads = spec_.num_heads;
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
  const void* attn_in = device_floats(l.attn);
  if (activation_ != DType::kF32) {
    if (!fi.has_value()) {
      ATTNSERVE_CUDA_RETURN_IF_ERROR(
          LaunchConvertFloats(device_floats(l.attn), ToKvType(activation_), device(l.attn16),
                              int64_t{rows} * q_width_, stream_),
          "attention output to the activation dtype");
    }
    attn_in = device(l.attn16);
  }
  if (absl::Status s =
          o_proj_.Run(*context_.cublas, cublas_, stream_, attn_in, m_rows, device_floats(l.o.out));
      !s.ok()) {
    return s;
  }
  return Download(l.o, l.up.bytes, rows);
}

PagedKv CudaGqaLayer::PagedView(const CallLayout& l) const {
  PagedKv kv;
  kv.pool = pages_.store().pool_base();
  kv.page_offsets = reinterpret_cast<const int64_t*>(device(l.up.pages));
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
  if (fi.has_value()) {
    // q in the page dtype for FlashInfer (the whole fused row: one contiguous conversion), then its
    // output straight into the output projection's 16-bit input.
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchConvertFloats(device_floats(l.qkv), ToKvType(kv_config_.storage.element),
                            device(l.qkv16), int64_t{rows} * qkv_width_, stream_),
        "q to the page dtype");
    return flashinfer_->Launch(*fi, reinterpret_cast<const int32_t*>(device(l.up.flashinfer_words)),
                               pages_.store().pool_base(), device(l.qkv16), qkv_width_,
                               device(l.attn16), device(l.flashinfer_scratch), stream_);
  }
  // attn[rows, heads * head_dim]: one block per work item of the plan.
  const BatchPlanShape& shape = plan_shape_;
  AttentionParams attn;
  attn.q = device_floats(l.qkv);
  attn.q_stride = qkv_width_;
  attn.out = device_floats(l.attn);
  attn.num_heads = spec_.num_heads;
  attn.group = shape.group;
  attn.scale = variation_.scale;
  attn.mask = shape.mask;
  attn.variant.softcap = spec_.attn_logit_softcapping;
  // The CPU's own mapping of the spec to ALiBi (kind, heads, bias max), so both take one slope.
  attn.variant.alibi = variation_.alibi;
  attn.variant.sinks = spec_.attention_sinks ? static_cast<const float*>(sinks_.data()) : nullptr;
  attn.kv = PagedView(l);
  attn.sequences = reinterpret_cast<const SequenceDesc*>(device(l.up.sequences));
  attn.batch = static_cast<int>(plan.sequences.size());
  attn.items = reinterpret_cast<const WorkItem*>(device(l.up.items));
  attn.num_items = static_cast<int>(plan.items.size());
  if (!decode) return RunPrefillAttention(kv_config_.storage, spec_.head_dim, attn, stream_);
  attn.partial_max = device_floats(l.partial_max);
  attn.partial_sum = device_floats(l.partial_sum);
  attn.partial_acc = device_floats(l.partial_acc);
  attn.item_begin = reinterpret_cast<const int*>(device(l.up.item_begin));
  return RunDecodeAttention(kv_config_.storage, spec_.head_dim, attn, shape.decode_row_blocks,
                            stream_);
}

}  // namespace attnserve::cuda

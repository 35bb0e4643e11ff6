#include "kernels/cpu/gqa_layer.h"

#include <algorithm>

#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/paged_kv_source.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/cpu/scratch_floats.h"
#include "kernels/spec/rope_frequencies.h"

namespace attnserve {

namespace {
// The scale a q/k norm multiplies by: w (Qwen3RMSNorm), or 1 + w in float32 (Gemma3RMSNorm).
std::vector<float> QkNormScale(const LayerSpec& spec, const LayerWeights& weights,
                               const std::string& name) {
  if (spec.qk_norm == QkNorm::kNone) return {};
  std::vector<float> scale = weights.at(name).ToFloats();
  if (spec.qk_norm == QkNorm::kRmsUnitOffset) {
    for (float& w : scale) w = 1.0f + w;
  }
  return scale;
}

// q, k and v_proj's weights [out, d_model] stacked in that order.
ProjectionWeight StackedQkv(const LayerSpec& spec, const LayerWeights& weights, DType dtype) {
  std::vector<float> stacked;
  for (const char* name : {"q_proj.weight", "k_proj.weight", "v_proj.weight"}) {
    const std::vector<float> w = weights.at(name).ToFloats();
    stacked.insert(stacked.end(), w.begin(), w.end());
  }
  const int64_t out = static_cast<int64_t>(stacked.size()) / spec.d_model;
  return ProjectionWeight(std::move(stacked), out, spec.d_model, dtype);
}

// The stacked biases, a zero block for a projection without one; empty when none has a bias.
std::vector<float> StackedQkvBias(const LayerSpec& spec, const LayerWeights& weights) {
  const int64_t q_width = int64_t{spec.num_heads} * spec.head_dim;
  const int64_t kv_width = int64_t{spec.num_kv_heads} * spec.head_dim;
  std::vector<float> bq = FloatsOrEmpty(weights, "q_proj.bias");
  std::vector<float> bk = FloatsOrEmpty(weights, "k_proj.bias");
  std::vector<float> bv = FloatsOrEmpty(weights, "v_proj.bias");
  if (bq.empty() && bk.empty() && bv.empty()) return {};
  bq.resize(q_width, 0.0f);
  bk.resize(kv_width, 0.0f);
  bv.resize(kv_width, 0.0f);
  bq.insert(bq.end(), bk.begin(), bk.end());
  bq.insert(bq.end(), bv.begin(), bv.end());
  return bq;
}
}  // namespace

KvPageLayout GqaLayer::MakePageLayout(const LayerSpec& spec, const KvCacheConfig& kv_config) {
  // The layout of kernels/kv/page_layout.h (shared with the CUDA kernels), as strides.
  const int page_size = kv_config.page_size, heads = spec.num_kv_heads, dim = spec.head_dim;
  KvPageLayout layout;
  layout.page_size = page_size;
  layout.dtype = kv_config.storage.element;
  layout.row_stride = GqaPageKeyElement(page_size, dim, 0, 1);
  layout.head_stride = GqaPageKeyElement(page_size, dim, 1, 0);
  layout.key_offset = GqaPageKeyElement(page_size, dim, 0, 0);
  layout.value_offset = GqaPageValueOffset(page_size, heads, dim);
  layout.page_elements = GqaPageElements(page_size, heads, dim);
  if (kv_config.storage.quantized()) {  // Scales: K of each KV head, then V of each.
    layout.quantization = kv_config.storage.quantization;
    layout.scales_offset = QuantizedPageScaleOffset(layout.page_elements);
    layout.scale_count = GqaPageScaleCount(heads);
    layout.value_scales = heads;
  }
  return layout;
}

GqaLayer::GqaLayer(const LayerSpec& spec, const LayerWeights& weights,
                   const KvCacheConfig& kv_config, DType projection_weights, ThreadPool* pool)
    : CpuLayer(spec, kv_config, MakePageLayout(spec, kv_config), pool),
      q_width_(spec.num_heads * spec.head_dim),
      kv_width_(spec.num_kv_heads * spec.head_dim),
      wqkv_(StackedQkv(spec, weights, projection_weights)),
      wo_(weights.at("o_proj.weight").ToFloats(), spec.d_model, q_width_, projection_weights),
      bqkv_(StackedQkvBias(spec, weights)),
      bo_(FloatsOrEmpty(weights, "o_proj.bias")),
      q_norm_scale_(QkNormScale(spec, weights, "q_norm.weight")),
      k_norm_scale_(QkNormScale(spec, weights, "k_norm.weight")),
      sinks_(FloatsOrEmpty(weights, "sinks")),
      rope_inv_freq_(RopeInverseFrequencies(spec)),
      variation_(AttentionVariation::FromSpec(
          spec,
          {sinks_.data(), q_norm_scale_.data(), k_norm_scale_.data(), rope_inv_freq_.data()})),
      rope_table_(variation_.rope.active() ? RopeTable::For(variation_.rope) : nullptr) {}

int64_t GqaLayer::ParameterBytes() const {
  const int64_t projections =
      wqkv_.out_features() * wqkv_.in_features() + wo_.out_features() * wo_.in_features();
  return (ParameterCount(spec()) - projections) * static_cast<int64_t>(sizeof(float)) +
         wqkv_.bytes() + wo_.bytes();
}

void GqaLayer::ProjectAndCache(const CpuBatch& batch, Buffers& p) {
  const LayerSpec& s = spec();
  const int64_t rows = batch.rows;
  const int64_t qkv_width = wqkv_.out_features();
  // Grows only: a decode step of no more rows than an earlier one allocates nothing.
  float* qkv = p.qkv.Resize(rows * qkv_width);
  float* q = qkv;
  float* k = qkv + q_width_;
  float* v = qkv + q_width_ + kv_width_;
  LinearForward(batch.hidden, s.d_model, rows, wqkv_, bqkv_.empty() ? nullptr : bqkv_.data(), qkv,
                qkv_width, pool());
  // Per row, the pre-RoPE transform (q/k norm, so the cache holds k after it), then RoPE on the
  // leading RotaryDim(s) dims of each head (all of them unless rotary_dim is set): a row's q heads
  // and then its k heads are consecutive head_dim-wide vectors. The row's cos/sin come from the
  // model's shared table (RotateRows' values, computed once per position) into `table`.
  const HeadRmsNorm& norm = variation_.qk_norm;
  const RotaryPositions& rope = variation_.rope;
  if (norm.active() || rope.active()) {
    ForRowRuns(rows, [&](int64_t r0, int64_t r1) {
      // Per thread, kept: a decode step allocates nothing.
      thread_local ScratchFloats table_scratch;
      float* const table = table_scratch.Resize(rope.active() ? rope.rotary_dim : 0);
      for (int64_t r = r0; r < r1; ++r) {
        if (norm.active()) {
          norm.Apply(q + r * qkv_width, s.num_heads, norm.q_scale);
          norm.Apply(k + r * qkv_width, s.num_kv_heads, norm.k_scale);
        }
        if (rope.active()) {
          rope_table_->Lookup(batch.positions[r], table);
          rope.Rotate(q + r * qkv_width, s.num_heads + s.num_kv_heads, s.head_dim, table,
                      table + rope.pairs());
        }
      }
    });
  }
  StoreKvRows(batch, s.num_kv_heads, s.head_dim, k, v, qkv_width);
}

void GqaLayer::OutputProjection(const CpuBatch& batch, const float* attention) {
  LinearForward(attention, q_width_, batch.rows, wo_, bo_.empty() ? nullptr : bo_.data(),
                batch.out, spec().d_model, pool());
}

void GqaLayer::RunPrefill(const CpuBatch& batch) {
  const LayerSpec& s = spec();
  // Per calling thread, shared by the prefills of every layer it runs: fresh buffers of this size
  // (12 MiB of qkv at 2048 MHA tokens) had their pages faulted in again on every call.
  thread_local Buffers p;
  ProjectAndCache(batch, p);
  std::vector<PagedKvSource> sources;
  sources.reserve(batch.sequences.size());
  std::vector<PrefillSequence> sequences;
  for (const BatchSequence& seq : batch.sequences) {
    sources.emplace_back(seq.table, &store(), &layout(), s.head_dim, s.head_dim);
    sequences.push_back(
        {seq.first_row, seq.num_new, seq.first_index, seq.table->num_tokens, &sources.back()});
  }
  // Every row belongs to one sequence, and PrefillAttention writes each of its heads.
  float* attention = p.attention.Resize(batch.rows * q_width_);
  PrefillAttentionParams params;
  params.q = p.qkv.data();  // q in place in the fused projection.
  params.q_row_stride = wqkv_.out_features();
  params.out = attention;
  params.out_row_stride = q_width_;
  params.num_kv_heads = s.num_kv_heads;
  params.group_size = s.num_heads / s.num_kv_heads;
  params.key_dim = s.head_dim;
  params.value_dim = s.head_dim;
  params.variation = variation_;
  PrefillAttention(params, sequences, pool());
  OutputProjection(batch, attention);
  p.qkv.Trim(kMaxRetainedScratchFloats);
  p.attention.Trim(kMaxRetainedScratchFloats);
}

void GqaLayer::RunDecode(const CpuBatch& batch) {
  const LayerSpec& s = spec();
  Buffers& p = decode_buffers_;
  ProjectAndCache(batch, p);
  // q [rows, num_heads * head_dim] out of the fused projection: [batch, num_kv_heads, group,
  // head_dim] as the decode kernel takes it.
  const int64_t qkv_width = wqkv_.out_features();
  float* q = p.q.Resize(batch.rows * q_width_);
  for (int64_t r = 0; r < batch.rows; ++r) {
    std::copy_n(p.qkv.data() + r * qkv_width, q_width_, q + r * q_width_);
  }
  float* attention = p.attention.Resize(batch.rows * q_width_);
  std::fill_n(attention, batch.rows * q_width_, 0.0f);
  std::vector<const PageTable*> tables;
  for (const BatchSequence& seq : batch.sequences) tables.push_back(seq.table);
  DecodeAttentionParams params;
  params.q = q;
  params.out = attention;
  params.batch = static_cast<int>(batch.rows);
  params.num_kv_heads = s.num_kv_heads;
  params.rows_per_kv_head = s.num_heads / s.num_kv_heads;
  params.key_dim = s.head_dim;
  params.value_dim = s.head_dim;
  params.variation = variation_;
  params.layout = layout();
  params.store = &store();
  params.tables = tables;
  PagedDecodeAttention(params, pool());
  OutputProjection(batch, attention);
}

}  // namespace attnserve

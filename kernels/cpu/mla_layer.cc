#include "kernels/cpu/mla_layer.h"

#include <cblas.h>

#include <cmath>

#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/prefill_attention.h"
#include "kernels/cpu/scratch_floats.h"
#include "kernels/spec/rope_frequencies.h"

namespace attnserve {

namespace {

// x <- scale * x / sqrt(mean(x^2) + eps), as DeepseekV3RMSNorm (float32 throughout).
void RmsNormRows(float* x, int64_t rows, int64_t row_stride, int64_t width, const float* scale,
                 float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * row_stride;
    float sum_squares = 0.0f;
    for (int64_t i = 0; i < width; ++i) sum_squares += row[i] * row[i];
    const float inv_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(width) + eps);
    for (int64_t i = 0; i < width; ++i) row[i] = scale[i] * (row[i] * inv_rms);
  }
}

// Expanded keys/values of one sequence for prefill: the latents of keys [begin, end) up-projected
// through kv_b_proj, served per head as key = [k_nope_h | k_pe], value = v_h.
class ExpandedLatentSource : public KvBlockSource {
 public:
  // `expanded` [end - begin, num_heads * (nope + v)] must outlive the source.
  ExpandedLatentSource(const MlaDims& dims, int num_heads, int64_t begin, const float* expanded,
                       std::vector<float> rope_keys)
      : dims_(dims),
        num_heads_(num_heads),
        begin_(begin),
        expanded_(expanded),
        rope_keys_(std::move(rope_keys)) {}

  void Fill(int head, int64_t begin, int64_t end, float* keys, float* values) const override {
    const int nope = dims_.qk_nope_head_dim, rope = dims_.qk_rope_head_dim, v = dims_.v_head_dim;
    const int64_t width = int64_t{num_heads_} * (nope + v);
    for (int64_t index = begin; index < end; ++index) {
      const float* row = &expanded_[(index - begin_) * width + int64_t{head} * (nope + v)];
      float* key = keys + (index - begin) * (nope + rope);
      std::copy(row, row + nope, key);
      const float* pe = rope_keys_.data() + (index - begin_) * rope;  // Empty when rope == 0.
      std::copy(pe, pe + rope, key + nope);
      std::copy(row + nope, row + nope + v, values + (index - begin) * v);
    }
  }

 private:
  MlaDims dims_;
  int num_heads_;
  int64_t begin_;
  const float* expanded_;         // [end - begin, num_heads * (nope + v)]
  std::vector<float> rope_keys_;  // [end - begin, rope]
};

}  // namespace

KvPageLayout MlaLayer::MakePageLayout(const LayerSpec& spec, const KvCacheConfig& kv_config) {
  KvPageLayout layout;
  layout.page_size = kv_config.page_size;
  layout.dtype = kv_config.storage.element;
  const int row_width = spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim;
  layout.row_stride = MlaPageRowElement(row_width, 1);  // kernels/kv/page_layout.h
  layout.head_stride = 0;
  layout.key_offset = 0;    // The key is the whole row [c_kv | k_pe] ...
  layout.value_offset = 0;  // ... and the value its first kv_lora_rank elements.
  layout.page_elements = kv_config.page_size * layout.row_stride;
  if (kv_config.storage.quantized()) {  // Scales: the latent c_kv, then the RoPE key k_pe.
    layout.quantization = kv_config.storage.quantization;
    layout.scales_offset = QuantizedPageScaleOffset(layout.page_elements);
    layout.scale_count = MlaPageScaleCount();
    layout.split_column = spec.mla.kv_lora_rank;
  }
  return layout;
}

MlaLayer::MlaLayer(const LayerSpec& spec, const LayerWeights& weights,
                   const KvCacheConfig& kv_config, bool absorbed_decode, ThreadPool* pool)
    : CpuLayer(spec, kv_config, MakePageLayout(spec, kv_config), pool),
      dims_(spec.mla),
      qk_dim_(spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim),
      latent_dim_(spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim),
      kv_b_width_(spec.mla.qk_nope_head_dim + spec.mla.v_head_dim),
      absorbed_decode_(absorbed_decode),
      wq_(FloatsOrEmpty(weights, "q_proj.weight")),
      wq_a_(FloatsOrEmpty(weights, "q_a_proj.weight")),
      q_a_norm_(FloatsOrEmpty(weights, "q_a_layernorm.weight")),
      wq_b_(FloatsOrEmpty(weights, "q_b_proj.weight")),
      wkv_a_(weights.at("kv_a_proj_with_mqa.weight").ToFloats()),
      kv_a_norm_(weights.at("kv_a_layernorm.weight").ToFloats()),
      wkv_b_(weights.at("kv_b_proj.weight").ToFloats()),
      wo_(weights.at("o_proj.weight").ToFloats()),
      rope_inv_freq_(RopeInverseFrequencies(spec)),
      variation_(AttentionVariation::FromSpec(spec, {.rope_inv_freq = rope_inv_freq_.data()})) {}

const float* MlaLayer::ComputeQueries(const CpuBatch& batch, ScratchFloats& q_buffer) {
  const LayerSpec& s = spec();
  const int64_t rows = batch.rows;
  const int64_t width = int64_t{s.num_heads} * qk_dim_;
  float* const q = q_buffer.Resize(rows * width);
  if (dims_.q_lora_rank == 0) {
    LinearForward(batch.hidden, s.d_model, rows, wq_.data(), nullptr, s.d_model, width, q, width,
                  pool());
  } else {
    // Per calling thread, as the latents below and the prefill's q and attention output: zeroed
    // vectors of these sizes (12 MiB at 2048 MLA tokens) were faulted in and cleared on the
    // calling thread on every prefill while the pool waited. Every element is written.
    thread_local ScratchFloats q_latent_scratch;
    float* const q_latent = q_latent_scratch.Resize(rows * dims_.q_lora_rank);
    LinearForward(batch.hidden, s.d_model, rows, wq_a_.data(), nullptr, s.d_model,
                  dims_.q_lora_rank, q_latent, dims_.q_lora_rank, pool());
    ForRowRuns(rows, [&](int64_t r0, int64_t r1) {
      RmsNormRows(q_latent + r0 * dims_.q_lora_rank, r1 - r0, dims_.q_lora_rank,
                  dims_.q_lora_rank, q_a_norm_.data(), dims_.rms_norm_eps);
    });
    LinearForward(q_latent, dims_.q_lora_rank, rows, wq_b_.data(), nullptr, dims_.q_lora_rank,
                  width, q, width, pool());
    q_latent_scratch.Trim(kMaxRetainedScratchFloats);
  }
  // RoPE on each head's q_pe, the last qk_rope_head_dim elements of the head.
  if (const RotaryPositions& rope = variation_.rope; rope.active()) {
    ForRowRuns(rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> table(rope.rotary_dim);
      rope.RotateRows(q + r0 * width + dims_.qk_nope_head_dim, r1 - r0, width, s.num_heads,
                      qk_dim_, batch.positions.data() + r0, table.data());
    });
  }
  return q;
}

void MlaLayer::ComputeAndCacheLatents(const CpuBatch& batch) {
  const LayerSpec& s = spec();
  thread_local ScratchFloats new_latent_scratch;  // As ComputeQueries' q_latent.
  float* const latent = new_latent_scratch.Resize(batch.rows * latent_dim_);
  LinearForward(batch.hidden, s.d_model, batch.rows, wkv_a_.data(), nullptr, s.d_model, latent_dim_,
                latent, latent_dim_, pool());
  ForRowRuns(batch.rows, [&](int64_t r0, int64_t r1) {
    RmsNormRows(latent + r0 * latent_dim_, r1 - r0, latent_dim_, dims_.kv_lora_rank,
                kv_a_norm_.data(), dims_.rms_norm_eps);
  });
  // RoPE on k_pe, the row's last qk_rope_head_dim elements.
  if (const RotaryPositions& rope = variation_.rope; rope.active()) {
    ForRowRuns(batch.rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> table(rope.rotary_dim);
      rope.RotateRows(latent + r0 * latent_dim_ + dims_.kv_lora_rank, r1 - r0, latent_dim_,
                      1, dims_.qk_rope_head_dim, batch.positions.data() + r0, table.data());
    });
  }
  StoreKvRows(batch, /*num_kv_heads=*/1, latent_dim_, latent, /*values=*/nullptr, latent_dim_);
  new_latent_scratch.Trim(kMaxRetainedScratchFloats);
}

void MlaLayer::OutputProjection(const CpuBatch& batch, const float* attention) {
  const LayerSpec& s = spec();
  const int64_t width = int64_t{s.num_heads} * dims_.v_head_dim;
  LinearForward(attention, width, batch.rows, wo_.data(), nullptr, width, s.d_model,
                batch.out, s.d_model, pool());
}

void MlaLayer::RunPrefill(const CpuBatch& batch) {
  const LayerSpec& s = spec();
  thread_local ScratchFloats q_scratch, attention_scratch;  // As ComputeQueries' q_latent.
  const float* const q = ComputeQueries(batch, q_scratch);
  ComputeAndCacheLatents(batch);

  // Up-project, per sequence, the cached latents its new tokens can see (read back from the pages
  // so prefill and decode attend to the same, possibly bf16-rounded, values).
  std::vector<ExpandedLatentSource> sources;
  sources.reserve(batch.sequences.size());
  std::vector<PrefillSequence> sequences;
  const int64_t expanded_width = int64_t{s.num_heads} * kv_b_width_;
  auto visible_begin = [&](const BatchSequence& seq) {
    return variation_.mask.VisibleKeys(seq.first_index, seq.table->num_tokens).begin;
  };
  // Every sequence's up-projection back to back, and the latents, in per-thread buffers kept
  // across calls (kMaxRetainedScratchFloats): fresh, they were 19 MiB of zeroed pages at 2048
  // tokens, faulted in on the calling thread on every prefill.
  thread_local ScratchFloats expanded_scratch, latent_scratch;
  int64_t expanded_floats = 0, max_count = 0;
  for (const BatchSequence& seq : batch.sequences) {
    const int64_t count = seq.table->num_tokens - visible_begin(seq);
    expanded_floats += count * expanded_width;
    max_count = std::max(max_count, count);
  }
  float* expanded = expanded_scratch.Resize(expanded_floats);
  float* const latents = latent_scratch.Resize(max_count * latent_dim_);
  for (const BatchSequence& seq : batch.sequences) {
    const int64_t begin = visible_begin(seq);
    const int64_t count = seq.table->num_tokens - begin;
    ForRowRuns(count, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const std::byte* page = store().page(seq.table->PageOf(begin + j, layout().page_size));
        const int slot = static_cast<int>((begin + j) % layout().page_size);
        ReadPageRow(layout(), page, 0, /*value=*/false, slot, latent_dim_,
                    &latents[j * latent_dim_]);
      }
    });
    LinearForward(latents, latent_dim_, count, wkv_b_.data(), nullptr, dims_.kv_lora_rank,
                  expanded_width, expanded, expanded_width, pool());
    std::vector<float> rope_keys(count * dims_.qk_rope_head_dim);
    for (int64_t j = 0; j < count; ++j) {
      const float* pe = &latents[j * latent_dim_ + dims_.kv_lora_rank];
      std::copy(pe, pe + dims_.qk_rope_head_dim, rope_keys.data() + j * dims_.qk_rope_head_dim);
    }
    sources.emplace_back(dims_, s.num_heads, begin, expanded, std::move(rope_keys));
    expanded += count * expanded_width;
    sequences.push_back(
        {seq.first_row, seq.num_new, seq.first_index, seq.table->num_tokens, &sources.back()});
  }

  const int64_t out_width = int64_t{s.num_heads} * dims_.v_head_dim;
  // Every element written: each row's heads by PrefillAttention.
  float* const attention = attention_scratch.Resize(batch.rows * out_width);
  PrefillAttentionParams params;
  params.q = q;
  params.q_row_stride = int64_t{s.num_heads} * qk_dim_;
  params.out = attention;
  params.out_row_stride = out_width;
  params.num_kv_heads = s.num_heads;  // Expanded: every head has its own keys.
  params.group_size = 1;
  params.key_dim = qk_dim_;
  params.value_dim = dims_.v_head_dim;
  params.variation = variation_;
  PrefillAttention(params, sequences, pool());
  OutputProjection(batch, attention);
  expanded_scratch.Trim(kMaxRetainedScratchFloats);
  latent_scratch.Trim(kMaxRetainedScratchFloats);
  q_scratch.Trim(kMaxRetainedScratchFloats);
  attention_scratch.Trim(kMaxRetainedScratchFloats);
}

void MlaLayer::AbsorbedDecode(const CpuBatch& batch, const float* q,
                              std::vector<float>& attention) {
  const LayerSpec& s = spec();
  const int heads = s.num_heads;
  const int nope = dims_.qk_nope_head_dim, rope = dims_.qk_rope_head_dim;
  const int kv_lora = dims_.kv_lora_rank, v = dims_.v_head_dim;
  const int64_t rows = batch.rows;

  // q_latent[b, h] = [q_nope[b, h] · W_UK_h | q_pe[b, h]], W_UK_h = kv_b_proj rows
  // [h*(nope+v), h*(nope+v)+nope) as a [nope, kv_lora] matrix.
  std::vector<float> q_latent(rows * heads * latent_dim_);
  pool().ParallelFor(heads, [&](int64_t h) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), kv_lora, nope,
                1.0f, &q[h * qk_dim_], heads * qk_dim_, &wkv_b_[h * kv_b_width_ * kv_lora], kv_lora,
                0.0f, &q_latent[h * latent_dim_], heads * latent_dim_);
    for (int64_t b = 0; b < rows; ++b) {
      const float* pe = &q[(b * heads + h) * qk_dim_ + nope];
      std::copy(pe, pe + rope, &q_latent[(b * heads + h) * latent_dim_ + kv_lora]);
    }
  });

  std::vector<const PageTable*> tables;
  for (const BatchSequence& seq : batch.sequences) tables.push_back(seq.table);
  std::vector<float> latent_out(rows * heads * kv_lora);  // [b, h, kv_lora]
  DecodeAttentionParams params;
  params.q = q_latent.data();
  params.out = latent_out.data();
  params.batch = static_cast<int>(rows);
  params.num_kv_heads = 1;  // The latent is shared by all heads.
  params.rows_per_kv_head = heads;
  params.key_dim = latent_dim_;
  params.value_dim = kv_lora;
  params.variation = variation_;
  params.layout = layout();
  params.store = &store();
  params.tables = tables;
  PagedDecodeAttention(params, pool());

  // attention[b, h] = latent_out[b, h] · W_UV_h^T, W_UV_h = kv_b_proj rows
  // [h*(nope+v)+nope, (h+1)*(nope+v)) as a [v, kv_lora] matrix.
  pool().ParallelFor(heads, [&](int64_t h) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), v, kv_lora, 1.0f,
                &latent_out[h * kv_lora], heads * kv_lora,
                &wkv_b_[(h * kv_b_width_ + nope) * kv_lora], kv_lora, 0.0f, &attention[h * v],
                heads * v);
  });
}

void MlaLayer::RunDecode(const CpuBatch& batch) {
  if (!absorbed_decode_) {
    // The expanded form is prefill with one token per sequence.
    RunPrefill(batch);
    return;
  }
  ScratchFloats q_buffer;
  const float* const q = ComputeQueries(batch, q_buffer);
  ComputeAndCacheLatents(batch);
  std::vector<float> attention(batch.rows * spec().num_heads * dims_.v_head_dim);
  AbsorbedDecode(batch, q, attention);
  OutputProjection(batch, attention.data());
}

}  // namespace attnserve

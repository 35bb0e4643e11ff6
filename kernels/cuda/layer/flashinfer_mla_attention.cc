#include "kernels/cuda/layer/flashinfer_mla_attention.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/flashinfer/page_table.h"
#include "kernels/cuda/flashinfer/paged_mla.h"
#include "kernels/cuda/runtime/cuda_status.h"

namespace attnserve::cuda {

bool FlashInferMlaAttention::Serves(const LayerSpec& spec, const KvCacheConfig& kv_config,
                                    int64_t pool_bytes) {
#if defined(ATTNSERVE_HAVE_FLASHINFER)
  return spec.variant == AttentionVariant::kMLA && kv_config.storage.element == DType::kBF16 &&
         !kv_config.storage.quantized() && spec.mla.kv_lora_rank == kFlashInferMlaLatent &&
         spec.mla.qk_rope_head_dim == kFlashInferMlaRope && spec.causal &&
         spec.sliding_window == 0 && pool_bytes / 2 <= int64_t{UINT32_MAX};
#else
  (void)spec, (void)kv_config, (void)pool_bytes;
  return false;
#endif
}

FlashInferMlaAttention FlashInferMlaAttention::Create(const LayerSpec& spec,
                                                      const KvCacheConfig& kv_config,
                                                      int64_t page_bytes, int64_t slab_bytes,
                                                      int multiprocessors) {
  FlashInferMlaAttention a;
  a.num_heads_ = spec.num_heads;
  a.page_size_ = kv_config.page_size;
  a.unit_bytes_ = FlashInferPageUnitBytes(page_bytes, slab_bytes);
  a.multiprocessors_ = multiprocessors;
  a.sm_scale_ = EffectiveSoftmaxScale(spec);
  return a;
}

absl::StatusOr<FlashInferMlaAttention::CallPlan> FlashInferMlaAttention::Plan(
    const BatchPlan& plan) const {
  absl::StatusOr<FlashInferPageTable> table =
      BuildFlashInferPageTable(plan.sequences, plan.page_offsets, page_size_, unit_bytes_);
  if (!table.ok()) return table.status();
  std::vector<FlashInferMlaSequence> sequences;
  for (size_t b = 0; b < plan.sequences.size(); ++b) {
    sequences.push_back({table->q_indptr[b + 1] - table->q_indptr[b], table->kv_len[b]});
  }
  std::optional<FlashInferMlaPlan> schedule =
      PlanFlashInferMla(sequences, table->q_indptr, table->indptr, num_heads_,
                        kFlashInferMlaLatent, /*causal=*/true, multiprocessors_);
  if (!schedule.has_value()) {
    return absl::InternalError("FlashInfer's MLA schedule refused the batch");
  }
  CallPlan call;
  call.words = schedule->packed;
  call.page_indices = static_cast<int>((call.words.size() + 3) / 4 * 4);
  call.words.resize(call.page_indices);
  call.words.insert(call.words.end(), table->page_indices.begin(), table->page_indices.end());
  call.lse_offset = static_cast<size_t>((schedule->partial_o_bytes + 15) / 16 * 16);
  call.scratch_bytes = call.lse_offset + static_cast<size_t>(schedule->partial_lse_bytes);
  call.schedule = *std::move(schedule);
  return call;
}

absl::Status FlashInferMlaAttention::Launch(const CallPlan& call, const int32_t* words, void* pool,
                                            const void* q, void* out, void* scratch,
                                            cudaStream_t stream) const {
  FlashInferMlaArgs args;
  args.q = q;
  args.num_heads = num_heads_;
  args.pool = pool;
  args.page_stride_elements = unit_bytes_ / 2;  // bf16 elements.
  args.page_size = page_size_;
  args.page_indices = words + call.page_indices;
  args.words = words;
  args.plan = &call.schedule;
  args.partial_o = scratch;
  args.partial_lse = reinterpret_cast<float*>(static_cast<char*>(scratch) + call.lse_offset);
  args.out = out;
  args.sm_scale = sm_scale_;
#if defined(ATTNSERVE_HAVE_FLASHINFER)
  return CudaStatus(LaunchFlashInferMla(args, stream), "FlashInfer MLA attention");
#else
  (void)args, (void)stream;
  return absl::UnimplementedError("this build has no FlashInfer MLA kernel");
#endif
}

}  // namespace attnserve::cuda

#include "kernels/cuda/layer/flashinfer_attention.h"

#include <climits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/flashinfer/page_table.h"
#include "kernels/cuda/runtime/cuda_status.h"
#if defined(ATTNSERVE_HAVE_FLASHINFER)
#include "kernels/cuda/flashinfer/paged_decode.h"
#include "kernels/cuda/flashinfer/paged_prefill.h"
#endif

namespace attnserve::cuda {

namespace {

int Group(const LayerSpec& spec) { return spec.num_heads / spec.num_kv_heads; }

// Appends `values` to `words` at a 16-byte boundary (FlashInfer reads its index arrays with
// vector loads in places) and returns where they start.
int Append(std::vector<int32_t>& words, const std::vector<int32_t>& values) {
  while (words.size() % 4 != 0) words.push_back(0);
  const int at = static_cast<int>(words.size());
  words.insert(words.end(), values.begin(), values.end());
  return at;
}

}  // namespace

bool FlashInferAttention::Serves(const LayerSpec& spec, const KvCacheConfig& kv_config) {
#if defined(ATTNSERVE_HAVE_FLASHINFER)
  const DType element = kv_config.storage.element;
  if (kv_config.storage.quantized() || (element != DType::kF16 && element != DType::kBF16)) {
    return false;
  }
  // Its instances take a soft-cap but no sink term and are built without ALiBi (use_alibi =
  // false): sinks and ALiBi run the native kernels.
  if (spec.attention_sinks || spec.alibi != Alibi::kNone) return false;
  return FlashInferPrefillSupports(ToKvType(element), spec.head_dim, Group(spec));
#else
  (void)spec;
  (void)kv_config;
  return false;
#endif
}

FlashInferAttention::FlashInferAttention(const LayerSpec& spec, const KvCacheConfig& kv_config,
                                         int64_t unit_bytes, int decode_grid_budget)
    : spec_(spec),
      kv_config_(kv_config),
      unit_bytes_(unit_bytes),
      decode_grid_budget_(decode_grid_budget) {}

absl::StatusOr<FlashInferAttention> FlashInferAttention::Create(const LayerSpec& spec,
                                                                const KvCacheConfig& kv_config,
                                                                int64_t page_bytes,
                                                                int64_t slab_bytes,
                                                                int64_t pool_bytes) {
  const int64_t unit = FlashInferPageUnitBytes(page_bytes, slab_bytes);
  const int64_t element_bytes = static_cast<int64_t>(DTypeSize(kv_config.storage.element));
  if (unit % element_bytes != 0 || unit / element_bytes > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cuda_attention = flashinfer: pages of ", page_bytes, " bytes in slabs of ", slab_bytes,
        " bytes have no page stride FlashInfer can take"));
  }
  if (pool_bytes / unit > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cuda_attention = flashinfer: a KV pool of ", pool_bytes, " bytes in units of ", unit,
        " bytes needs page indices beyond FlashInfer's int32; use a smaller --kv_pool_bytes"));
  }
  int budget = 0;
#if defined(ATTNSERVE_HAVE_FLASHINFER)
  const KvType type = ToKvType(kv_config.storage.element);
  if (FlashInferDecodeSupports(type, spec.head_dim, Group(spec))) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        FlashInferDecodeGridBudget(type, spec.head_dim, Group(spec),
                                   spec.attn_logit_softcapping > 0.0f, &budget),
        "measuring FlashInfer's decode grid budget");
  }
#endif
  return FlashInferAttention(spec, kv_config, unit, budget);
}

absl::StatusOr<FlashInferAttention::CallPlan> FlashInferAttention::Plan(const BatchPlan& plan,
                                                                        bool decode) const {
  absl::StatusOr<FlashInferPageTable> table = BuildFlashInferPageTable(
      plan.sequences, plan.page_offsets, kv_config_.page_size, unit_bytes_);
  if (!table.ok()) return table.status();
  CallPlan call;
  call.batch = static_cast<int>(plan.sequences.size());
  call.decode_kernel = decode && decode_grid_budget_ > 0;
  call.indptr = Append(call.words, table->indptr);
  call.page_indices = Append(call.words, table->page_indices);
  call.last_page_len = Append(call.words, table->last_page_len);
  call.q_indptr = Append(call.words, table->q_indptr);
  if (call.decode_kernel) {
    FlashInferDecodeShape shape;
    shape.page_size = kv_config_.page_size;
    shape.num_heads = spec_.num_heads;
    shape.num_kv_heads = spec_.num_kv_heads;
    shape.head_dim = spec_.head_dim;
    shape.grid_budget = decode_grid_budget_;
    FlashInferDecodePlan schedule;
    if (!PlanFlashInferDecode(table->kv_pages, shape, &schedule)) {
      return absl::InternalError("FlashInfer decode: no schedule for this batch");
    }
    call.schedule = Append(call.words, schedule.packed);
    call.decode = schedule.info;
    const size_t element = DTypeSize(kv_config_.storage.element);
    call.tmp_s_offset = (static_cast<size_t>(call.decode.tmp_v_elements) * element + 15) / 16 * 16;
    call.scratch_bytes =
        call.tmp_s_offset + static_cast<size_t>(call.decode.tmp_s_elements) * sizeof(float);
  } else {
    std::vector<FlashInferPrefillSequence> sequences;
    for (size_t b = 0; b < plan.sequences.size(); ++b) {
      sequences.push_back({plan.sequences[b].num_new, table->kv_len[b]});
    }
    std::optional<FlashInferPrefillPlan> schedule =
        PlanFlashInferPrefill(sequences, Group(spec_), spec_.head_dim);
    if (!schedule.has_value()) {
      return absl::InternalError("FlashInfer prefill: no schedule for this batch");
    }
    call.schedule = Append(call.words, schedule->packed);
    call.prefill = *std::move(schedule);
    call.prefill.packed.clear();
  }
  return call;
}

absl::Status FlashInferAttention::Launch(const CallPlan& call, const int32_t* words, void* pool,
                                         const void* q, int64_t q_stride_row, void* out,
                                         void* scratch, cudaStream_t stream) const {
#if defined(ATTNSERVE_HAVE_FLASHINFER)
  FlashInferPages kv;
  kv.kv_type = ToKvType(kv_config_.storage.element);
  kv.head_dim = spec_.head_dim;
  kv.num_kv_heads = spec_.num_kv_heads;
  kv.page_size = kv_config_.page_size;
  kv.pool = pool;
  kv.page_stride_elements =
      unit_bytes_ / static_cast<int64_t>(DTypeSize(kv_config_.storage.element));
  kv.indptr = words + call.indptr;
  kv.page_indices = words + call.page_indices;
  kv.last_page_len = words + call.last_page_len;
  const int window = spec_.causal ? spec_.sliding_window : 0;
  if (call.decode_kernel) {
    FlashInferDecodeArgs args;
    args.kv = kv;
    args.num_heads = spec_.num_heads;
    args.q = q;
    args.q_stride_n = q_stride_row;
    args.q_stride_h = spec_.head_dim;
    args.out = out;
    args.window = window;
    args.soft_cap = spec_.attn_logit_softcapping;
    args.sm_scale = EffectiveSoftmaxScale(spec_);
    args.plan_info = call.decode;
    args.plan = words + call.schedule;
    if (call.decode.split_kv) {
      args.tmp_v = scratch;
      args.tmp_s = reinterpret_cast<float*>(static_cast<char*>(scratch) + call.tmp_s_offset);
    }
    ATTNSERVE_CUDA_RETURN_IF_ERROR(FlashInferDecode(args, stream), "FlashInfer decode launch");
    return absl::OkStatus();
  }
  FlashInferPrefillArgs args;
  args.kv = kv;
  args.num_heads = spec_.num_heads;
  args.batch = call.batch;
  args.q = q;
  args.q_stride_row = q_stride_row;
  args.q_indptr = words + call.q_indptr;
  args.out = out;
  args.causal = spec_.causal;
  args.window = window;
  args.soft_cap = spec_.attn_logit_softcapping;
  args.sm_scale = EffectiveSoftmaxScale(spec_);
  args.schedule = FlashInferPrefillSchedule::Of(call.prefill, words + call.schedule);
  ATTNSERVE_CUDA_RETURN_IF_ERROR(FlashInferPrefill(args, stream), "FlashInfer prefill launch");
  return absl::OkStatus();
#else
  (void)call, (void)words, (void)pool, (void)q, (void)q_stride_row, (void)out, (void)scratch,
      (void)stream;
  return absl::FailedPreconditionError("this build has no FlashInfer kernels");
#endif
}

}  // namespace attnserve::cuda

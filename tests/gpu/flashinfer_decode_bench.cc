#include "tests/gpu/flashinfer_decode_bench.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/flashinfer/decode_plan.h"
#include "kernels/cuda/flashinfer/paged_decode.h"
#include "kernels/cuda/flashinfer/paged_kv_view.h"
#include "kernels/cuda/runtime/cuda_status.h"
#include "tests/gpu/bench_device_kernels.h"

namespace attnserve::bench {

absl::StatusOr<FlashInferTiming> TimeFlashInferDecode(const FlashInferBenchInputs& in,
                                                      const MedianMsFn& median_ms,
                                                      cudaStream_t stream) {
  const int group = in.heads / in.kv_heads;
  if (!cuda::FlashInferDecodeSupports(in.kv_type, in.head_dim, group)) {
    return absl::UnimplementedError(
        absl::StrCat("no FlashInfer decode instance for group ", group, " head_dim ", in.head_dim,
                     " (FlashInfer runs such groups with its prefill kernel)"));
  }
  const int64_t elem = 2;
  const int64_t page_bytes = int64_t{2} * in.kv_heads * in.page_size * in.head_dim * elem;
  const int pages_per_seq = (in.tokens + in.page_size - 1) / in.page_size;
  // Pages wholly before the window are left out, as the layer drops evicted ones.
  const int first_page = in.window > 0 ? std::max(0, in.tokens - in.window) / in.page_size : 0;

  std::vector<int32_t> indptr = {0}, page_indices, last_page_len, visible_pages;
  for (int b = 0; b < in.batch; ++b) {
    for (int p = first_page; p < pages_per_seq; ++p) {
      const int64_t offset = (*in.page_offsets)[static_cast<size_t>(b) * pages_per_seq + p];
      page_indices.push_back(static_cast<int32_t>(offset / page_bytes));
    }
    visible_pages.push_back(pages_per_seq - first_page);
    indptr.push_back(static_cast<int32_t>(page_indices.size()));
    last_page_len.push_back(in.tokens - (pages_per_seq - 1) * in.page_size);
  }

  cuda::FlashInferDecodeShape shape;
  shape.page_size = in.page_size;
  shape.num_heads = in.heads;
  shape.num_kv_heads = in.kv_heads;
  shape.head_dim = in.head_dim;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cuda::FlashInferDecodeGridBudget(in.kv_type, in.head_dim, group, /*soft_cap=*/false,
                                       &shape.grid_budget),
      "FlashInfer decode occupancy");
  cuda::FlashInferDecodePlan plan;
  if (!cuda::PlanFlashInferDecode(visible_pages, shape, &plan)) {
    return absl::InternalError("PlanFlashInferDecode refused the batch");
  }

  const int64_t q_count = int64_t{in.batch} * in.q_stride;
  const int64_t out_count = int64_t{in.batch} * in.heads * in.head_dim;
  absl::StatusOr<DevicePtr> q = Allocate(q_count * elem, "16-bit q");
  absl::StatusOr<DevicePtr> out = Allocate(out_count * elem, "FlashInfer output");
  absl::StatusOr<DevicePtr> d_indptr = Upload(indptr, "indptr");
  absl::StatusOr<DevicePtr> d_pages = Upload(page_indices, "page indices");
  absl::StatusOr<DevicePtr> d_last = Upload(last_page_len, "last page lengths");
  absl::StatusOr<DevicePtr> d_plan = Upload(plan.packed, "decode plan");
  absl::StatusOr<DevicePtr> tmp_v = Allocate(plan.info.tmp_v_elements * elem, "tmp_v");
  absl::StatusOr<DevicePtr> tmp_s = Allocate(plan.info.tmp_s_elements * sizeof(float), "tmp_s");
  for (const absl::StatusOr<DevicePtr>* d :
       {&q, &out, &d_indptr, &d_pages, &d_last, &d_plan, &tmp_v, &tmp_s}) {
    if (!d->ok()) return d->status();
  }
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      LaunchFillUniform(q->get(), in.kv_type, q_count, in.q_seed, 1.0f, stream), "filling q");
  // 0xFF bytes are NaN: an output row the kernels never wrote fails the check below.
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out->get(), 0xFF, out_count * elem, stream),
                                 "poisoning the output");

  cuda::FlashInferDecodeArgs args;
  args.kv.kv_type = in.kv_type;
  args.kv.head_dim = in.head_dim;
  args.kv.num_kv_heads = in.kv_heads;
  args.kv.page_size = in.page_size;
  args.kv.pool = in.pool;
  args.kv.page_stride_elements = page_bytes / elem;
  args.kv.indptr = static_cast<const int32_t*>(d_indptr->get());
  args.kv.page_indices = static_cast<const int32_t*>(d_pages->get());
  args.kv.last_page_len = static_cast<const int32_t*>(d_last->get());
  args.num_heads = in.heads;
  args.q = q->get();
  args.q_stride_n = in.q_stride;
  args.q_stride_h = in.head_dim;
  args.out = out->get();
  args.window = in.window;
  args.sm_scale = 1.0f / std::sqrt(static_cast<float>(in.head_dim));
  args.plan_info = plan.info;
  args.plan = static_cast<const int32_t*>(d_plan->get());
  if (plan.info.split_kv) {
    args.tmp_v = tmp_v->get();
    args.tmp_s = static_cast<float*>(tmp_s->get());
  }
  absl::StatusOr<double> ms = median_ms(
      [&]() { return cuda::CudaStatus(cuda::FlashInferDecode(args, stream), "FlashInferDecode"); });
  if (!ms.ok()) return ms.status();

  std::vector<uint16_t> host(static_cast<size_t>(out_count));
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host.data(), out->get(), host.size() * elem, cudaMemcpyDeviceToHost),
      "downloading the FlashInfer output");
  // f16 and bf16 alike: exponent bits all ones is Inf or NaN.
  const uint16_t exponent = in.kv_type == cuda::KvType::kF16 ? 0x7C00 : 0x7F80;
  int64_t bad = 0;
  for (uint16_t x : host) bad += (x & exponent) == exponent ? 1 : 0;
  if (bad > 0) return absl::InternalError(absl::StrCat(bad, " non-finite FlashInfer outputs"));

  FlashInferTiming timing;
  timing.ms = *ms;
  timing.items = plan.info.padded_batch_size;
  timing.split_kv = plan.info.split_kv;
  return timing;
}

}  // namespace attnserve::bench

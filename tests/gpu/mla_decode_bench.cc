#include "tests/gpu/mla_decode_bench.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/flashinfer/mla_plan.h"
#include "kernels/cuda/flashinfer/paged_mla.h"
#include "kernels/cuda/mla/mla_dispatch.h"
#include "kernels/cuda/mla/mla_params.h"
#include "kernels/cuda/runtime/cuda_status.h"
#include "kernels/spec/decode_splits.h"
#include "tests/gpu/bench_device_kernels.h"

namespace attnserve::bench {

namespace {

struct Free {
  void operator()(void* p) const { cudaFree(p); }
};
using Buffer = std::unique_ptr<void, Free>;

absl::StatusOr<Buffer> Alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 16)), what);
  return Buffer(p);
}

template <typename T>
absl::StatusOr<Buffer> Upload(const std::vector<T>& host, const char* what) {
  absl::StatusOr<Buffer> b = Alloc(sizeof(T) * host.size(), what);
  if (!b.ok()) return b.status();
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(b->get(), host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice), what);
  return b;
}

}  // namespace

absl::StatusOr<MlaDecodeTiming> TimeMlaDecode(const MlaDecodeCase& c, bool flashinfer,
                                              int multiprocessors, const MlaMedianMsFn& median_ms,
                                              cudaStream_t stream) {
  using cuda::KvType;
  const int width = c.latent + c.rope;
  const int64_t page_elements = int64_t{c.page_size} * width;
  const int64_t page_bytes = page_elements * 2;  // bf16
  const int pages_per_seq = (c.tokens + c.page_size - 1) / c.page_size;
  const int64_t num_pages = int64_t{c.batch} * pages_per_seq;
  absl::StatusOr<Buffer> pool = Alloc(static_cast<size_t>(num_pages * page_bytes), "MLA pages");
  if (!pool.ok()) return pool.status();
  ATTNSERVE_CUDA_RETURN_IF_ERROR(LaunchFillUniform(pool->get(), KvType::kBF16,
                                                   num_pages * page_elements, 0x5EED, 1.0f, stream),
                                 "filling MLA pages");
  std::vector<int64_t> page_ids(static_cast<size_t>(num_pages));
  std::iota(page_ids.begin(), page_ids.end(), int64_t{0});
  std::shuffle(page_ids.begin(), page_ids.end(), std::mt19937_64(17));
  const int64_t rows = c.batch;
  const int64_t q_count = rows * c.heads * width;
  MlaDecodeTiming timing;
  timing.kv_bytes = static_cast<double>(c.batch) * c.tokens * width * 2.0;

  std::vector<cuda::SequenceDesc> descs;
  for (int b = 0; b < c.batch; ++b) {
    cuda::SequenceDesc d;
    d.first_row = b;
    d.num_new = 1;
    d.first_index = c.tokens - 1;
    d.length = c.tokens;
    d.first_page = b * pages_per_seq;
    descs.push_back(d);
  }
  if (flashinfer) {
#if !ATTNSERVE_BENCH_FLASHINFER
    return absl::UnimplementedError("this build has no FlashInfer MLA instance");
#else
    // Page indices in units of one page (the pool is one allocation of whole pages).
    std::vector<int32_t> q_indptr{0}, kv_indptr{0}, indices;
    std::vector<cuda::FlashInferMlaSequence> seqs;
    for (int b = 0; b < c.batch; ++b) {
      q_indptr.push_back(b + 1);
      for (int p = 0; p < pages_per_seq; ++p) {
        indices.push_back(static_cast<int32_t>(page_ids[b * pages_per_seq + p]));
      }
      kv_indptr.push_back(static_cast<int32_t>(indices.size()));
      seqs.push_back({1, c.tokens});
    }
    std::optional<cuda::FlashInferMlaPlan> plan = cuda::PlanFlashInferMla(
        seqs, q_indptr, kv_indptr, c.heads, c.latent, /*causal=*/true, multiprocessors);
    if (!plan.has_value()) return absl::InternalError("MLA schedule refused");
    timing.items = plan->total_works;
    absl::StatusOr<Buffer> words = Upload(plan->packed, "MLA schedule");
    absl::StatusOr<Buffer> page_indices = Upload(indices, "MLA page indices");
    absl::StatusOr<Buffer> q = Alloc(q_count * 2, "bf16 queries");
    absl::StatusOr<Buffer> out = Alloc(rows * c.heads * c.latent * 2, "bf16 output");
    const size_t lse_offset = static_cast<size_t>((plan->partial_o_bytes + 15) / 16 * 16);
    absl::StatusOr<Buffer> scratch =
        Alloc(lse_offset + static_cast<size_t>(plan->partial_lse_bytes), "MLA partials");
    for (const auto* b : {&words, &page_indices, &q, &out, &scratch}) {
      if (!b->ok()) return b->status();
    }
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        LaunchFillUniform(q->get(), KvType::kBF16, q_count, 0x0123, 1.0f, stream), "filling q");
    cuda::FlashInferMlaArgs args;
    args.q = q->get();
    args.num_heads = c.heads;
    args.pool = pool->get();
    args.page_stride_elements = page_elements;
    args.page_size = c.page_size;
    args.page_indices = static_cast<const int32_t*>(page_indices->get());
    args.words = static_cast<const int32_t*>(words->get());
    args.plan = &*plan;
    args.partial_o = scratch->get();
    args.partial_lse = reinterpret_cast<float*>(static_cast<char*>(scratch->get()) + lse_offset);
    args.out = out->get();
    args.sm_scale = 1.0f / std::sqrt(192.0f);
    absl::StatusOr<double> ms = median_ms([&]() -> absl::Status {
      return cuda::CudaStatus(cuda::LaunchFlashInferMla(args, stream), "FlashInfer MLA");
    });
    if (!ms.ok()) return ms.status();
    timing.ms = *ms;
    return timing;
#endif
  }

  // Ours: the layer's plan (PlanDecodeSplits with every head a row of the one KV head).
  const cuda::MaskSpec mask{1, 0};
  const int row_blocks = (c.heads + cuda::kMlaRowsPerBlock - 1) / cuda::kMlaRowsPerBlock;
  const int64_t wanted = cuda::DecodeSplitsForTwoWaves(c.batch, 1, row_blocks, multiprocessors);
  std::vector<cuda::WorkItem> items;
  std::vector<int> item_begin;
  for (int b = 0; b < c.batch; ++b) {
    item_begin.push_back(static_cast<int>(items.size()));
    cuda::PlanDecodeSplits(descs[b], b, mask, wanted, kDecodeMinKeysPerSplit, items);
  }
  item_begin.push_back(static_cast<int>(items.size()));
  timing.items = static_cast<int>(items.size());
  std::vector<int64_t> offsets;
  for (int64_t id : page_ids) offsets.push_back(id * page_bytes);
  const int64_t partial_rows = static_cast<int64_t>(items.size()) * c.heads;
  absl::StatusOr<Buffer> table = Upload(offsets, "MLA page table");
  absl::StatusOr<Buffer> d_descs = Upload(descs, "sequences");
  absl::StatusOr<Buffer> d_items = Upload(items, "work items");
  absl::StatusOr<Buffer> d_begin = Upload(item_begin, "item_begin");
  absl::StatusOr<Buffer> q = Alloc(q_count * 4, "queries");
  absl::StatusOr<Buffer> out = Alloc(rows * c.heads * c.latent * 4, "output");
  absl::StatusOr<Buffer> pmax = Alloc(partial_rows * 4, "partial max");
  absl::StatusOr<Buffer> psum = Alloc(partial_rows * 4, "partial sum");
  absl::StatusOr<Buffer> pacc = Alloc(partial_rows * c.latent * 4, "partial acc");
  for (const auto* b : {&table, &d_descs, &d_items, &d_begin, &q, &out, &pmax, &psum, &pacc}) {
    if (!b->ok()) return b->status();
  }
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      LaunchFillUniform(q->get(), KvType::kF32, q_count, 0x0123, 1.0f, stream), "filling q");
  cuda::MlaAttentionParams p;
  p.q = static_cast<const float*>(q->get());
  p.out = static_cast<float*>(out->get());
  p.num_heads = c.heads;
  p.scale = 1.0f / std::sqrt(192.0f);
  p.mask = mask;
  p.kv = cuda::MlaPagedKv{pool->get(), static_cast<const int64_t*>(table->get()), c.page_size,
                          c.latent, c.rope};
  p.sequences = static_cast<const cuda::SequenceDesc*>(d_descs->get());
  p.batch = c.batch;
  p.items = static_cast<const cuda::WorkItem*>(d_items->get());
  p.num_items = static_cast<int>(items.size());
  p.partial_max = static_cast<float*>(pmax->get());
  p.partial_sum = static_cast<float*>(psum->get());
  p.partial_acc = static_cast<float*>(pacc->get());
  p.item_begin = static_cast<const int*>(d_begin->get());
  absl::StatusOr<double> ms = median_ms(
      [&]() -> absl::Status { return cuda::RunMlaDecodeAttention(DType::kBF16, p, stream); });
  if (!ms.ok()) return ms.status();
  timing.ms = *ms;
  return timing;
}

}  // namespace attnserve::bench

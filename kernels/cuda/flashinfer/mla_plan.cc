#include "kernels/cuda/flashinfer/mla_plan.h"

#include <algorithm>
#include <utility>

namespace attnserve::cuda {

namespace {

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// FlashInfer's MinHeap (attention/heap.h): the same std::push_heap / pop_heap calls on the same
// comparator, so ties resolve as in MLAPlan and the schedules agree work for work.
class MinHeap {
 public:
  using Element = std::pair<int, float>;  // (cluster, accumulated cost)
  explicit MinHeap(int capacity) : heap_(capacity) {
    for (int i = 0; i < capacity; ++i) heap_[i] = {i, 0.0f};
  }
  void Insert(const Element& e) {
    heap_.push_back(e);
    std::push_heap(heap_.begin(), heap_.end(), Compare);
  }
  Element Pop() {
    std::pop_heap(heap_.begin(), heap_.end(), Compare);
    const Element e = heap_.back();
    heap_.pop_back();
    return e;
  }

 private:
  static bool Compare(const Element& a, const Element& b) { return a.second > b.second; }
  std::vector<Element> heap_;
};

float Cost(int qo_len, int kv_len) { return 2 * float(qo_len) + kv_len; }  // cost_function

// packed_causal_kv_end: the keys a causal tile of packed rows can see (queries right-aligned).
int PackedCausalKvEnd(int qo_len, int kv_len, int tile, int tile_rows, int num_tiles, int heads) {
  if (tile + 1 == num_tiles) return kv_len;
  const int kv_len_init = kv_len - qo_len;
  return std::max(std::min(kv_len_init + CeilDiv(int64_t{tile + 1} * tile_rows, heads), kv_len), 0);
}

// MLAPlan's chunk limit from the average keys per cluster.
int KvLenLimit(int64_t x) {
  if (x <= 8) return 32;
  if (x <= 16) return 64;
  if (x <= 32) return 128;
  if (x <= 64) return 192;
  return CeilDiv(x, 256) * 256;
}

// AlignedAllocator's 16-byte aligned sections, in int32 elements.
int Section(std::vector<int32_t>& packed, const std::vector<int32_t>& values, size_t size) {
  const int offset = static_cast<int>((packed.size() + 3) / 4 * 4);
  packed.resize(offset + size, 0);
  std::copy(values.begin(), values.end(), packed.begin() + offset);
  return offset;
}

}  // namespace

std::optional<FlashInferMlaPlan> PlanFlashInferMla(
    const std::vector<FlashInferMlaSequence>& sequences, const std::vector<int32_t>& q_indptr,
    const std::vector<int32_t>& kv_indptr, int num_heads, int head_dim_o, bool causal,
    int num_sm) {
  const int batch = static_cast<int>(sequences.size());
  if (batch == 0 || num_heads < 1 || num_sm < 1 || head_dim_o < 1 ||
      q_indptr.size() != sequences.size() + 1 || kv_indptr.size() != sequences.size() + 1) {
    return std::nullopt;
  }
  int64_t accum_packed_qo_len = 0;
  for (const FlashInferMlaSequence& s : sequences) {
    if (s.qo_len < 0 || s.kv_len < s.qo_len) return std::nullopt;
    accum_packed_qo_len += int64_t{s.qo_len} * num_heads;
  }
  const int64_t avg_packed_qo_len = accum_packed_qo_len / batch;
  const int cluster_size = avg_packed_qo_len > 64 ? 2 : 1;
  const int num_clusters = num_sm / cluster_size;
  if (num_clusters < 1) return std::nullopt;
  FlashInferMlaPlan plan;
  plan.num_blks_x = cluster_size;
  plan.num_blks_y = num_clusters;
  const int cluster_tile_q = cluster_size * 64;

  int64_t total_kv_lens = 0;
  for (const FlashInferMlaSequence& s : sequences) {
    const int packed_qo_len = s.qo_len * num_heads;
    const int num_tiles = CeilDiv(packed_qo_len, cluster_tile_q);
    for (int tile = num_tiles - 1; tile >= 0; --tile) {
      total_kv_lens += causal ? PackedCausalKvEnd(s.qo_len, s.kv_len, tile, cluster_tile_q,
                                                  num_tiles, num_heads)
                              : s.kv_len;
    }
  }
  const int kv_len_limit =
      KvLenLimit(std::max<int64_t>(CeilDiv(total_kv_lens, num_clusters), 1));

  MinHeap heap(num_clusters);
  std::vector<std::vector<int32_t>> c_q_indptr(num_clusters), c_kv_indptr(num_clusters),
      c_q_len(num_clusters), c_kv_len(num_clusters), c_q_start(num_clusters),
      c_kv_start(num_clusters), c_kv_end(num_clusters), c_partial_indptr(num_clusters);
  std::vector<int32_t> merge_start(num_sm, 0), merge_end(num_sm, 0), merge_partial_start(num_sm, 0),
      merge_partial_end(num_sm, 0), merge_stride(num_sm, 0);
  int merge_ctas = 0, partial_o_nnz = 0;
  for (int i = 0; i < batch; ++i) {
    const FlashInferMlaSequence& s = sequences[i];
    const int packed_qo_len = s.qo_len * num_heads;
    const int num_tiles = CeilDiv(packed_qo_len, cluster_tile_q);
    for (int tile = num_tiles - 1; tile >= 0; --tile) {
      int remaining = causal ? PackedCausalKvEnd(s.qo_len, s.kv_len, tile, cluster_tile_q,
                                                 num_tiles, num_heads)
                             : s.kv_len;
      int kv_start = 0;
      const bool split_kv = remaining > kv_len_limit;
      const int row_tile_size = std::min(cluster_tile_q, packed_qo_len - tile * cluster_tile_q);
      if (split_kv) {
        const int num_chunks = std::max(remaining * cluster_size / kv_len_limit, 1);
        const int row_chunk_size = CeilDiv(row_tile_size, num_chunks);
        for (int start = 0; start < row_tile_size; start += row_chunk_size) {
          if (merge_ctas >= num_sm) return std::nullopt;  // MLAPlan's FLASHINFER_CHECK.
          const int base = q_indptr[i] * num_heads + tile * cluster_tile_q;
          merge_start[merge_ctas] = base + start;
          merge_end[merge_ctas] = base + std::min(start + row_chunk_size, row_tile_size);
          merge_partial_start[merge_ctas] = partial_o_nnz + start;
          merge_partial_end[merge_ctas] =
              partial_o_nnz + CeilDiv(remaining, kv_len_limit) * row_tile_size;
          merge_stride[merge_ctas] = row_tile_size;
          ++merge_ctas;
        }
      }
      const bool zero_kv_len = remaining == 0;
      while (remaining > 0 || zero_kv_len) {
        const auto [cluster, cost] = heap.Pop();
        const int actual = std::min(remaining, kv_len_limit);
        heap.Insert({cluster, cost + Cost(cluster_tile_q, actual)});
        c_q_len[cluster].push_back(s.qo_len);
        c_kv_len[cluster].push_back(s.kv_len);
        c_q_indptr[cluster].push_back(q_indptr[i]);
        c_kv_indptr[cluster].push_back(kv_indptr[i]);
        if (split_kv) {
          c_partial_indptr[cluster].push_back(partial_o_nnz);
          partial_o_nnz += row_tile_size;
        } else {
          c_partial_indptr[cluster].push_back(-1);
        }
        c_q_start[cluster].push_back(tile * cluster_tile_q);
        c_kv_start[cluster].push_back(kv_start);
        c_kv_end[cluster].push_back(kv_start + actual);
        remaining -= actual;
        kv_start += actual;
        if (zero_kv_len) break;
      }
    }
  }

  std::vector<int32_t> work_indptr(num_clusters + 1, 0);
  for (int c = 0; c < num_clusters; ++c) {
    work_indptr[c + 1] = work_indptr[c] + static_cast<int32_t>(c_q_indptr[c].size());
  }
  const int total_works = work_indptr.back();
  auto flatten = [&](const std::vector<std::vector<int32_t>>& v) {
    std::vector<int32_t> out;
    out.reserve(total_works);
    for (const auto& inner : v) out.insert(out.end(), inner.begin(), inner.end());
    return out;
  };
  plan.total_works = total_works;
  plan.merge_ctas = merge_ctas;
  plan.partial_rows = partial_o_nnz;
  const size_t works = std::max(total_works, 1);
  std::vector<int32_t>& p = plan.packed;
  plan.q_indptr = Section(p, flatten(c_q_indptr), works);
  plan.kv_indptr = Section(p, flatten(c_kv_indptr), works);
  plan.partial_indptr = Section(p, flatten(c_partial_indptr), works);
  plan.merge_packed_offset_start = Section(p, merge_start, num_sm);
  plan.merge_packed_offset_end = Section(p, merge_end, num_sm);
  plan.merge_partial_packed_offset_start = Section(p, merge_partial_start, num_sm);
  plan.merge_partial_packed_offset_end = Section(p, merge_partial_end, num_sm);
  plan.merge_partial_stride = Section(p, merge_stride, num_sm);
  plan.q_len = Section(p, flatten(c_q_len), works);
  plan.kv_len = Section(p, flatten(c_kv_len), works);
  plan.q_start = Section(p, flatten(c_q_start), works);
  plan.kv_start = Section(p, flatten(c_kv_start), works);
  plan.kv_end = Section(p, flatten(c_kv_end), works);
  plan.work_indptr = Section(p, work_indptr, work_indptr.size());
  plan.partial_o_bytes = int64_t{2} * num_clusters * cluster_tile_q * 2 * head_dim_o;
  plan.partial_lse_bytes = int64_t{2} * num_clusters * cluster_tile_q * 4;
  return plan;
}

}  // namespace attnserve::cuda

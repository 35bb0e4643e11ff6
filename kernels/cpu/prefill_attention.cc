#include "kernels/cpu/prefill_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/vector_math.h"

namespace attnserve {

namespace {

// About 64 rows per query block and 128 keys per key block: big enough for sgemm to run near its
// peak, small enough that Q, K, V, S and O of one item stay in L2.
constexpr int64_t kTargetRowsPerBlock = 64;
constexpr int64_t kKeysPerBlock = 128;

struct WorkItem {
  int sequence;
  int kv_head;
  int64_t query_begin;  // Offsets into the sequence's new tokens.
  int64_t query_end;
};

void AttendQueryBlock(const PrefillAttentionParams& p, const PrefillSequence& seq,
                      const WorkItem& item) {
  const int group = p.group_size;
  const int64_t tokens = item.query_end - item.query_begin;
  const int64_t rows = tokens * group;
  const float kNegInf = -std::numeric_limits<float>::infinity();

  // Gather Q rows: row = token * group + g.
  std::vector<float> q(rows * p.key_dim);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* src = p.q + (seq.first_row + item.query_begin + t) * p.q_row_stride +
                       int64_t{item.kv_head} * group * p.key_dim;
    std::copy(src, src + int64_t{group} * p.key_dim, &q[t * group * p.key_dim]);
  }
  std::vector<float> keys(kKeysPerBlock * p.key_dim), values(kKeysPerBlock * p.value_dim);
  std::vector<float> scores(rows * kKeysPerBlock);
  std::vector<float> acc(rows * p.value_dim, 0.0f), row_max(rows, kNegInf), row_sum(rows, 0.0f);

  // Keys any query of the block may see.
  const int64_t first_query = seq.first_index + item.query_begin;
  const int64_t last_query = seq.first_index + item.query_end - 1;
  const int64_t keys_begin = p.mask.VisibleKeys(first_query, seq.length).begin;
  const int64_t keys_end = p.mask.VisibleKeys(last_query, seq.length).end;

  for (int64_t block = keys_begin; block < keys_end; block += kKeysPerBlock) {
    const int64_t count = std::min(kKeysPerBlock, keys_end - block);
    seq.source->Fill(item.kv_head, block, block + count, keys.data(), values.data());
    // S = scale * Q · K^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(count), p.key_dim, p.scale, q.data(), p.key_dim, keys.data(),
                p.key_dim, 0.0f, scores.data(), static_cast<int>(count));
    // Mask, then the online-softmax update; P overwrites S.
    for (int64_t r = 0; r < rows; ++r) {
      const KeyRange visible = p.mask.VisibleKeys(first_query + r / group, seq.length);
      float* s = &scores[r * count];
      const int64_t lo = std::clamp(visible.begin - block, int64_t{0}, count);
      const int64_t hi = std::clamp(visible.end - block, int64_t{0}, count);
      if (lo >= hi) {
        std::fill(s, s + count, 0.0f);
        continue;
      }
      if (p.softcap > 0.0f) SoftCap(p.softcap, s + lo, hi - lo);
      float block_max = kNegInf;
      for (int64_t k = lo; k < hi; ++k) block_max = std::max(block_max, s[k]);
      const float new_max = std::max(row_max[r], block_max);
      const float correction = std::exp(row_max[r] - new_max);
      if (correction != 1.0f) {
        row_sum[r] *= correction;
        Scale(correction, &acc[r * p.value_dim], p.value_dim);
      }
      float block_sum = 0.0f;
      std::fill(s, s + lo, 0.0f);
#pragma omp simd reduction(+ : block_sum)
      for (int64_t k = lo; k < hi; ++k) {
        s[k] = ExpApprox(s[k] - new_max);
        block_sum += s[k];
      }
      std::fill(s + hi, s + count, 0.0f);
      row_sum[r] += block_sum;
      row_max[r] = new_max;
    }
    // O += P · V
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), p.value_dim,
                static_cast<int>(count), 1.0f, scores.data(), static_cast<int>(count),
                values.data(), p.value_dim, 1.0f, acc.data(), p.value_dim);
  }

  // Normalise and scatter back: row (token t, group g) -> out[t, kv_head * group + g].
  for (int64_t t = 0; t < tokens; ++t) {
    for (int g = 0; g < group; ++g) {
      const int64_t r = t * group + g;
      float* dst = p.out + (seq.first_row + item.query_begin + t) * p.out_row_stride +
                   (int64_t{item.kv_head} * group + g) * p.value_dim;
      float sum = row_sum[r];
      float acc_scale = 1.0f;
      if (p.sinks != nullptr) {
        // The sink is one more column of the row's softmax, counted once after every key block.
        const float sink = p.sinks[int64_t{item.kv_head} * group + g];
        const float new_max = std::max(row_max[r], sink);
        acc_scale = std::exp(row_max[r] - new_max);  // 0 for a row that saw no key.
        sum = sum * acc_scale + std::exp(sink - new_max);
      }
      const float inv = sum > 0.0f ? acc_scale / sum : 0.0f;
      for (int d = 0; d < p.value_dim; ++d) dst[d] = acc[r * p.value_dim + d] * inv;
    }
  }
}

}  // namespace

void PrefillAttention(const PrefillAttentionParams& p, absl::Span<const PrefillSequence> sequences,
                      ThreadPool& pool) {
  const int64_t tokens_per_block = std::max<int64_t>(1, kTargetRowsPerBlock / p.group_size);
  std::vector<WorkItem> items;
  for (size_t s = 0; s < sequences.size(); ++s) {
    for (int h = 0; h < p.num_kv_heads; ++h) {
      for (int64_t begin = 0; begin < sequences[s].num_new; begin += tokens_per_block) {
        items.push_back({static_cast<int>(s), h, begin,
                         std::min(begin + tokens_per_block, sequences[s].num_new)});
      }
    }
  }
  // Later query blocks see more keys (causal); start them first so the tail is short.
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) {
    return a.query_begin > b.query_begin;
  });
  pool.ParallelFor(static_cast<int64_t>(items.size()),
                   [&](int64_t i) { AttendQueryBlock(p, sequences[items[i].sequence], items[i]); });
}

}  // namespace attnserve

#include "kernels/cpu/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/vector_math.h"

namespace attnserve {

namespace {

// Keys per split are a multiple of this, so a split costs far more than its combine.
constexpr int64_t kMinKeysPerSplit = 256;

struct WorkItem {
  int sequence;
  int kv_head;
  KeyRange keys;
  int64_t partial_offset;  // Index of this item's first row in the partial-state arrays.
};

// Online-softmax state of `rows` query rows over part of the keys.
struct PartialState {
  float* max;  // [rows]
  float* sum;  // [rows]
  float* acc;  // [rows, value_dim], unnormalised
};

template <typename Element>
void AttendKeys(const DecodeAttentionParams& p, const float* q, const PageTable& table,
                int kv_head, KeyRange keys, PartialState state) {
  const int rows = p.rows_per_kv_head;
  const int page_size = p.layout.page_size;
  std::vector<float> scores(static_cast<size_t>(rows) * page_size);
  std::vector<float> key_row(p.key_dim), value_row(p.value_dim);
  std::fill(state.max, state.max + rows, -std::numeric_limits<float>::infinity());
  std::fill(state.sum, state.sum + rows, 0.0f);
  std::fill(state.acc, state.acc + int64_t{rows} * p.value_dim, 0.0f);

  for (int64_t block_begin = keys.begin; block_begin < keys.end;) {
    const int64_t page_index = block_begin / page_size;
    const int first_slot = static_cast<int>(block_begin - page_index * page_size);
    const int end_slot =
        static_cast<int>(std::min<int64_t>(keys.end - page_index * page_size, page_size));
    const int count = end_slot - first_slot;
    const auto* page =
        reinterpret_cast<const Element*>(p.store->page(table.pages[page_index]));

    // S = scale * Q · K^T for this page's keys; each key row is read once for all query rows.
    for (int s = 0; s < count; ++s) {
      const float* key = RowAsFloat(page + p.layout.KeyElement(kv_head, first_slot + s),
                                    p.key_dim, key_row.data());
      for (int r = 0; r < rows; ++r) {
        scores[r * page_size + s] = p.scale * Dot(q + int64_t{r} * p.key_dim, key, p.key_dim);
      }
    }
    // Online softmax: rescale what was accumulated when a row's running max grows.
    for (int r = 0; r < rows; ++r) {
      float* row_scores = &scores[r * page_size];
      float block_max = row_scores[0];
      for (int s = 1; s < count; ++s) block_max = std::max(block_max, row_scores[s]);
      const float new_max = std::max(state.max[r], block_max);
      const float correction = std::exp(state.max[r] - new_max);
      if (correction != 1.0f) {
        state.sum[r] *= correction;
        Scale(correction, state.acc + int64_t{r} * p.value_dim, p.value_dim);
      }
      float block_sum = 0.0f;
      for (int s = 0; s < count; ++s) {
        row_scores[s] = std::exp(row_scores[s] - new_max);
        block_sum += row_scores[s];
      }
      state.sum[r] += block_sum;
      state.max[r] = new_max;
    }
    // O += P · V, again one read of each value row for all query rows.
    for (int s = 0; s < count; ++s) {
      const float* value = RowAsFloat(page + p.layout.ValueElement(kv_head, first_slot + s),
                                      p.value_dim, value_row.data());
      for (int r = 0; r < rows; ++r) {
        Axpy(scores[r * page_size + s], value, state.acc + int64_t{r} * p.value_dim, p.value_dim);
      }
    }
    block_begin += count;
  }
}

}  // namespace

void PagedDecodeAttention(const DecodeAttentionParams& p, ThreadPool& pool) {
  const int rows = p.rows_per_kv_head;
  // Plan: how many key splits per (sequence, KV head). Enough items to keep every thread busy,
  // but never splits shorter than kMinKeysPerSplit keys.
  const int64_t base_items = int64_t{p.batch} * p.num_kv_heads;
  const int64_t wanted_splits =
      std::max<int64_t>(1, (2 * pool.num_threads() + base_items - 1) / base_items);
  std::vector<WorkItem> items;
  std::vector<int64_t> first_item_of(static_cast<size_t>(base_items) + 1);
  int64_t partial_rows = 0;
  for (int b = 0; b < p.batch; ++b) {
    const PageTable& table = *p.tables[b];
    const KeyRange keys = p.mask.VisibleKeys(table.num_tokens - 1, table.num_tokens);
    const int64_t num_keys = keys.end - keys.begin;
    const int64_t splits =
        std::clamp<int64_t>(num_keys / kMinKeysPerSplit, 1, wanted_splits);
    for (int h = 0; h < p.num_kv_heads; ++h) {
      first_item_of[int64_t{b} * p.num_kv_heads + h] = static_cast<int64_t>(items.size());
      for (int64_t split = 0; split < splits; ++split) {
        // Split boundaries fall on page boundaries so no page is read by two items.
        const int64_t page_size = p.layout.page_size;
        auto boundary = [&](int64_t i) {
          if (i == 0) return keys.begin;
          if (i == splits) return keys.end;
          const int64_t raw = keys.begin + num_keys * i / splits;
          return std::clamp<int64_t>(raw / page_size * page_size, keys.begin, keys.end);
        };
        items.push_back({b, h, {boundary(split), boundary(split + 1)}, partial_rows});
        partial_rows += rows;
      }
    }
  }
  first_item_of[base_items] = static_cast<int64_t>(items.size());

  std::vector<float> max(partial_rows), sum(partial_rows),
      acc(static_cast<size_t>(partial_rows) * p.value_dim);
  pool.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t i) {
    const WorkItem& item = items[i];
    const float* q =
        p.q + (int64_t{item.sequence} * p.num_kv_heads + item.kv_head) * rows * p.key_dim;
    PartialState state{&max[item.partial_offset], &sum[item.partial_offset],
                       &acc[item.partial_offset * p.value_dim]};
    if (item.keys.begin >= item.keys.end) {
      std::fill(state.max, state.max + rows, -std::numeric_limits<float>::infinity());
      std::fill(state.sum, state.sum + rows, 0.0f);
      std::fill(state.acc, state.acc + int64_t{rows} * p.value_dim, 0.0f);
      return;
    }
    const PageTable& table = *p.tables[item.sequence];
    if (p.layout.dtype == DType::kBF16) {
      AttendKeys<uint16_t>(p, q, table, item.kv_head, item.keys, state);
    } else {
      AttendKeys<float>(p, q, table, item.kv_head, item.keys, state);
    }
  });

  // Combine the splits of each (sequence, KV head): rescale each to the global max, then divide
  // by the global sum.
  pool.ParallelFor(base_items, [&](int64_t base) {
    float* out = p.out + base * rows * p.value_dim;
    for (int r = 0; r < rows; ++r) {
      float global_max = -std::numeric_limits<float>::infinity();
      for (int64_t i = first_item_of[base]; i < first_item_of[base + 1]; ++i) {
        global_max = std::max(global_max, max[items[i].partial_offset + r]);
      }
      float total = 0.0f;
      float* out_row = out + int64_t{r} * p.value_dim;
      std::fill(out_row, out_row + p.value_dim, 0.0f);
      for (int64_t i = first_item_of[base]; i < first_item_of[base + 1]; ++i) {
        const int64_t row = items[i].partial_offset + r;
        if (sum[row] == 0.0f) continue;
        const float weight = std::exp(max[row] - global_max);
        total += weight * sum[row];
        Axpy(weight, &acc[row * p.value_dim], out_row, p.value_dim);
      }
      if (total > 0.0f) Scale(1.0f / total, out_row, p.value_dim);
    }
  });
}

}  // namespace attnserve

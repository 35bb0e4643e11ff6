#include "kernels/cpu/decode_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/simd_kernels.h"
#include "kernels/spec/decode_splits.h"

namespace attnserve {

namespace {

// Keys per split are at least this (shared with the CUDA planner), so a split costs far more
// than its combine.
constexpr int64_t kMinKeysPerSplit = kDecodeMinKeysPerSplit;
// From this many query rows per KV head and keys per page (MLA's 64-token pages), a page is
// processed with sgemm rather than vector loops; below it sgemm's call overhead loses (measured:
// MQA with 16-token pages ran 30% slower through sgemm, absorbed MLA 10% faster).
constexpr int kMinRowsForGemm = 4;
constexpr int kMinKeysForGemm = 32;

struct WorkItem {
  int sequence;
  KeyRange keys;
  int64_t partial_offset;  // Index of this item's first row in the partial-state arrays.
};

// Online-softmax state of one sequence's query rows ([num_kv_heads, rows_per_kv_head]) over part
// of its keys.
struct PartialState {
  float* max;  // [rows]
  float* sum;  // [rows]
  float* acc;  // [rows, value_dim], unnormalised
};

// A softmax block: up to this many keys (whole pages) per online-softmax update, so the rescale,
// the exp set-up and the accumulator loads and stores are paid once per block rather than per
// 16-token page. 128 f32 keys of head_dim 64 are 32 KiB of K and as much V: they stay in L2.
constexpr int kBlockKeys = 128;

// Attends one KV head's query rows to `count` keys whose key and value rows are listed, updating
// their softmax state. `page_rows` > 0: the rows are one float page's slots, consecutive at
// p.layout.row_stride, which sgemm takes as a strided matrix.
// `site`: the block's first query row's head, the query index and the block's first key.
// `q_tiles`: q as GroupScoresQuery laid it out (GroupScores reads it; sgemm reads `q`).
template <typename Element>
void AttendBlock(const DecodeAttentionParams& p, const float* q, const float* q_tiles, int count,
                 float* scores, int padded_block, const Element* const* key_rows,
                 const Element* const* value_rows, bool use_gemm, LogitSite site,
                 PartialState state) {
  const int rows = p.rows_per_kv_head;
  // S = Q · K^T for this block; the block's keys stay in cache across rows.
  if (use_gemm) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, count, p.key_dim, 1.0f, q, p.key_dim,
                reinterpret_cast<const float*>(key_rows[0]), static_cast<int>(p.layout.row_stride),
                0.0f, scores, padded_block);
  } else {
    // Every query row of the group from each register tile of keys (simd_kernels.h).
    GroupScores(q_tiles, rows, p.key_dim, key_rows, count, scores, padded_block);
  }
  // Online softmax: rescale what was accumulated when a row's running max grows.
  for (int r = 0; r < rows; ++r) {
    OnlineSoftmaxRow(&scores[r * padded_block], count, 0, count, p.variation.scale, p.variation,
                     {site.head + r, site.query, site.first_key}, &state.max[r], &state.sum[r],
                     state.acc + int64_t{r} * p.value_dim, p.value_dim);
  }
  // O += P · V
  if (use_gemm) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, p.value_dim, count, 1.0f, scores,
                padded_block, reinterpret_cast<const float*>(value_rows[0]),
                static_cast<int>(p.layout.row_stride), 1.0f, state.acc, p.value_dim);
    return;
  }
  GroupAccumulate(scores, padded_block, rows, value_rows, count, p.value_dim, state.acc);
}

// Attends all of one sequence's query rows to keys [keys.begin, keys.end), in blocks of whole
// pages (kBlockKeys keys, at least one page). Each block is read whole (every KV head) before the
// next, so the hardware prefetcher sees a few sequential page streams. kDequantize (8-bit pages,
// Element float): each page's visited rows are first dequantized into a float32 copy of the page,
// which the float loops then read.
template <typename Element, bool kDequantize = false>
void AttendKeys(const DecodeAttentionParams& p, const float* q, const PageTable& table,
                KeyRange keys, PartialState state) {
  const int rows = p.rows_per_kv_head;
  const int64_t total_rows = int64_t{p.num_kv_heads} * rows;
  const int page_size = p.layout.page_size;
  // Many query rows on large float pages (absorbed MLA): a page's rows are already a strided
  // matrix, so sgemm's register tiling beats the vector loops; blocks are then single pages.
  // With AVX-512 the group tiles (simd_kernels.cc) serve them instead: measured on absorbed
  // MLA f32 (8 heads, 64-token pages), 13.6-16.0 ms against sgemm's 15.6-16.2 per step.
  const bool use_gemm = std::is_same_v<Element, float> && rows >= kMinRowsForGemm &&
                        page_size >= kMinKeysForGemm && !SimdKernelsUseAvx512();
  const int pages_per_block = use_gemm ? 1 : std::max(1, kBlockKeys / page_size);
  const int block_keys = pages_per_block * page_size;
  // Scores of one block, padded to a multiple of 4 keys: [rows, padded_block].
  const int padded_block = (block_keys + 3) / 4 * 4;
  std::vector<float> scores(static_cast<size_t>(rows) * padded_block);
  std::fill(state.max, state.max + total_rows, -std::numeric_limits<float>::infinity());
  std::fill(state.sum, state.sum + total_rows, 0.0f);
  std::fill(state.acc, state.acc + total_rows * p.value_dim, 0.0f);
  std::vector<const Element*> key_rows(padded_block), value_rows(padded_block);
  // q as GroupScores reads it (aligned; bf16 keys: in their column order), laid out once for all
  // the item's blocks rather than per block.
  const int64_t q_floats = total_rows * p.key_dim;
  std::vector<float> q_buffer(q_floats + 16);
  void* q_start = q_buffer.data();
  size_t q_space = q_buffer.size() * sizeof(float);
  float* const q_tiles =
      static_cast<float*>(std::align(64, q_floats * sizeof(float), q_start, q_space));
  for (int h = 0; h < p.num_kv_heads; ++h) {
    GroupScoresQuery(q + int64_t{h} * rows * p.key_dim, rows, p.key_dim,
                     std::is_same_v<Element, uint16_t>, q_tiles + int64_t{h} * rows * p.key_dim);
  }
  std::vector<float> dequantized(kDequantize ? p.layout.page_elements * pages_per_block : 0);
  // The block's pages: base pointer, first slot and key count of each.
  struct BlockPage {
    const Element* page;
    int first_slot;
    int count;
  };
  std::vector<BlockPage> block(pages_per_block);

  // Software prefetch, one KV head's block ahead: the rows of head h + 1 are requested while head
  // h computes. Each head's rows of a 16-token page are one 4 KiB
  // run (f32, head_dim 64), which the hardware prefetcher, stopping at 4 KiB boundaries, would
  // only pick up after a few misses.
  const int64_t element_bytes = sizeof(Element);
  const int64_t key_bytes = int64_t{p.key_dim} * element_bytes;
  const int64_t value_bytes = int64_t{p.value_dim} * element_bytes;
  const bool separate_values = p.layout.value_offset != p.layout.key_offset;
  auto prefetch_head = [&](const BlockPage* pages, int num, int h) {
    for (int i = 0; i < num; ++i) {
      for (int slot = pages[i].first_slot; slot < pages[i].first_slot + pages[i].count; ++slot) {
        const char* k = reinterpret_cast<const char*>(pages[i].page + p.layout.KeyElement(h, slot));
        for (int64_t b = 0; b < key_bytes; b += 64) __builtin_prefetch(k + b);
        if (!separate_values) continue;
        const char* v =
            reinterpret_cast<const char*>(pages[i].page + p.layout.ValueElement(h, slot));
        for (int64_t b = 0; b < value_bytes; b += 64) __builtin_prefetch(v + b);
      }
    }
  };

  const int64_t query = table.num_tokens - 1;  // The new token: the table holds it already.
  for (int64_t block_begin = keys.begin; block_begin < keys.end;) {
    const int64_t first_key = block_begin;
    int num_pages = 0;
    int count = 0;
    while (num_pages < pages_per_block && block_begin < keys.end) {
      const int64_t page_index = block_begin / page_size;
      const int first_slot = static_cast<int>(block_begin - page_index * page_size);
      const int end_slot =
          static_cast<int>(std::min<int64_t>(keys.end - page_index * page_size, page_size));
      const Element* page;
      if constexpr (kDequantize) {
        float* copy = dequantized.data() + num_pages * p.layout.page_elements;
        DequantizePageRows(p.layout, p.store->page(table.pages[page_index]), p.num_kv_heads,
                           p.key_dim, p.value_dim, first_slot, end_slot, copy);
        page = copy;
      } else {
        page = reinterpret_cast<const Element*>(p.store->page(table.pages[page_index]));
      }
      block[num_pages++] = {page, first_slot, end_slot - first_slot};
      count += end_slot - first_slot;
      block_begin += end_slot - first_slot;
    }
    for (int h = 0; h < p.num_kv_heads; ++h) {
      int s = 0;
      for (int i = 0; i < num_pages; ++i) {
        const BlockPage& bp = block[i];
        for (int slot = bp.first_slot; slot < bp.first_slot + bp.count; ++slot, ++s) {
          key_rows[s] = bp.page + p.layout.KeyElement(h, slot);
          value_rows[s] = bp.page + p.layout.ValueElement(h, slot);
        }
      }
      if (h + 1 < p.num_kv_heads) prefetch_head(block.data(), num_pages, h + 1);
      const int64_t first_row = int64_t{h} * rows;
      PartialState head_state{state.max + first_row, state.sum + first_row,
                              state.acc + first_row * p.value_dim};
      AttendBlock(p, q + first_row * p.key_dim, q_tiles + first_row * p.key_dim, count,
                  scores.data(), padded_block, key_rows.data(), value_rows.data(),
                  use_gemm && count >= kMinKeysForGemm, {h * rows, query, first_key}, head_state);
    }
  }
}

}  // namespace

void PagedDecodeAttention(const DecodeAttentionParams& p, ThreadPool& pool) {
  const int64_t rows = int64_t{p.num_kv_heads} * p.rows_per_kv_head;  // Query rows per sequence.
  // Plan: how many key splits per sequence. Enough items to keep every thread busy, but never
  // splits shorter than kMinKeysPerSplit keys.
  const int64_t wanted_splits =
      std::max<int64_t>(1, (2 * pool.num_threads() + p.batch - 1) / p.batch);
  std::vector<WorkItem> items;
  std::vector<int64_t> first_item_of(static_cast<size_t>(p.batch) + 1);
  int64_t partial_rows = 0;
  for (int b = 0; b < p.batch; ++b) {
    const PageTable& table = *p.tables[b];
    const KeyRange keys = p.variation.mask.VisibleKeys(table.num_tokens - 1, table.num_tokens);
    const int64_t num_keys = keys.end - keys.begin;
    const int64_t splits = std::clamp<int64_t>(num_keys / kMinKeysPerSplit, 1, wanted_splits);
    first_item_of[b] = static_cast<int64_t>(items.size());
    // Split boundaries fall on page boundaries so no page is read by two items.
    const int64_t page_size = p.layout.page_size;
    auto boundary = [&](int64_t i) {
      if (i == 0) return keys.begin;
      if (i == splits) return keys.end;
      const int64_t raw = keys.begin + num_keys * i / splits;
      return std::clamp<int64_t>(raw / page_size * page_size, keys.begin, keys.end);
    };
    for (int64_t split = 0; split < splits; ++split) {
      items.push_back({b, {boundary(split), boundary(split + 1)}, partial_rows});
      partial_rows += rows;
    }
  }
  first_item_of[p.batch] = static_cast<int64_t>(items.size());

  // One split per sequence (a batch of at least twice the threads): each item accumulates straight
  // into its sequence's output rows and normalises them itself, so the step needs no combine pass
  // (one fan-out of the pool fewer) and no partial accumulators. The arithmetic is the combine's
  // with a single split (weight exp(0) = 1), so the output is the same either way.
  const bool single_split = static_cast<int64_t>(items.size()) == p.batch;
  std::vector<float> max(partial_rows), sum(partial_rows),
      acc(single_split ? 0 : static_cast<size_t>(partial_rows) * p.value_dim);
  pool.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t i) {
    const WorkItem& item = items[i];
    const float* q = p.q + item.sequence * rows * p.key_dim;
    float* const item_acc = single_split ? p.out + item.sequence * rows * p.value_dim
                                         : &acc[item.partial_offset * p.value_dim];
    PartialState state{&max[item.partial_offset], &sum[item.partial_offset], item_acc};
    const PageTable& table = *p.tables[item.sequence];
    if (p.layout.quantized()) {
      AttendKeys<float, /*kDequantize=*/true>(p, q, table, item.keys, state);
    } else if (p.layout.dtype == DType::kBF16) {
      AttendKeys<uint16_t>(p, q, table, item.keys, state);
    } else {
      AttendKeys<float>(p, q, table, item.keys, state);
    }
    if (!single_split) return;
    for (int r = 0; r < rows; ++r) {
      float* out_row = item_acc + int64_t{r} * p.value_dim;
      float total = state.sum[r];
      if (total == 0.0f) {  // As the combine: a split without weight adds nothing.
        std::fill(out_row, out_row + p.value_dim, 0.0f);
      }
      const float rescale = p.variation.sinks.Join(r, state.max[r], &total);
      if (total > 0.0f) Scale(rescale / total, out_row, p.value_dim);
    }
  });
  if (single_split) return;

  // Combine the splits of each sequence: rescale each to the global max, then divide by the
  // global sum.
  pool.ParallelFor(p.batch, [&](int64_t base) {
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
      // The softmax's extra term (sinks) joins once, over all splits, never per split.
      const float rescale = p.variation.sinks.Join(r, global_max, &total);
      if (total > 0.0f) Scale(rescale / total, out_row, p.value_dim);
    }
  });
}

}  // namespace attnserve

#include "kernels/cpu/prefill_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/cpu/prefill_tiles.h"
#include "kernels/cpu/scratch_floats.h"
#include "kernels/cpu/simd_kernels.h"

namespace attnserve {

namespace {

// About 128 rows per query block and 512 keys per key block: Q, K, V, S (256 KiB) and O of one
// item stay in L2 (the tiles keep their short runs in L1), and the online softmax's per-row,
// per-block work (max, rescale of the accumulator, the reductions) is paid a quarter as often as
// with 128 keys (the prefill kernel alone, one thread: 128 -> 256 keys 5-7% less CPU time, 256 ->
// 512 another 2-4%; the sgemm path measured within ±3% of 128 earlier). 128 rows rather than 64
// halve how often an MHA item (one KV head, 128 tokens) streams its head's keys and values from
// L3: BM_PrefillAttention, one thread, least CPU time of 10 at load ~5 (so ±5%), MHA 69.8 against
// 81.3 ms, GQA-4 62.9 against 67.0, MQA 55.4 against 57.9; 256 rows measured the same as 128.
constexpr int64_t kTargetRowsPerBlock = 128;
constexpr int64_t kKeysPerBlock = 512;
// A key block the causal diagonal crosses is computed in row chunks of this many rows (a multiple
// of the tiles' 4), each only up to the last key its last row sees: with 128-token MHA query
// blocks the tiles would otherwise spend about 6% of their work on masked scores.
constexpr int64_t kDiagonalChunkRows = 16;
// Keys per gather task: a multiple of kKeyPanel, so every task packs whole panels.
constexpr int64_t kGatherChunkKeys = 256;

struct WorkItem {
  int sequence;
  int kv_head;
  int64_t query_begin;  // Offsets into the sequence's new tokens.
  int64_t query_end;
};

// Float32 keys and values [value_dim] of keys [begin, end) of one (sequence, KV head). The keys
// are rows [key_dim] on the portable (sgemm) path, and transposed 16-key panels from `begin` on
// (PackKeyPanels) on the tiled paths.
struct GatheredKv {
  int64_t begin = 0;
  float* keys = nullptr;
  float* values = nullptr;
};

// Floats a run of `count` keys takes when gathered: panels round the keys up to whole panels.
int64_t GatheredKeyFloats(PrefillTileIsa isa, int64_t count, int key_dim) {
  if (isa != PrefillTileIsa::kPortable) count = (count + kKeyPanel - 1) / kKeyPanel * kKeyPanel;
  return count * key_dim;
}

// Fills keys [begin, end) of `kv_head` into `keys` (rows, or panels from `begin` on) and `values`.
// Panels are packed from a per-thread row copy of the keys, so no second full-size buffer.
void GatherKv(PrefillTileIsa isa, const KvBlockSource& source, int kv_head, int64_t begin,
              int64_t end, int key_dim, float* keys, float* values) {
  if (isa == PrefillTileIsa::kPortable) {
    source.Fill(kv_head, begin, end, keys, values);
    return;
  }
  thread_local ScratchFloats rows;
  float* key_rows = rows.Resize((end - begin) * key_dim);
  source.Fill(kv_head, begin, end, key_rows, values);
  PackKeyPanels(key_rows, end - begin, key_dim, keys);
}

// Keys any new token of the sequence may see.
KeyRange SequenceKeys(const PrefillAttentionParams& p, const PrefillSequence& seq) {
  return {p.variation.mask.VisibleKeys(seq.first_index, seq.length).begin,
          p.variation.mask.VisibleKeys(seq.first_index + seq.num_new - 1, seq.length).end};
}

void AttendQueryBlock(const PrefillAttentionParams& p, PrefillTileIsa isa,
                      const PrefillSequence& seq, const WorkItem& item,
                      const GatheredKv* gathered) {
  const bool tiled = isa != PrefillTileIsa::kPortable;
  const int group = p.group_size;
  const int64_t tokens = item.query_end - item.query_begin;
  const int64_t rows = tokens * group;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  // No logit transform: a whole block's rows take OnlineSoftmaxRows in one call.
  const bool plain = !p.variation.softcap.active() && !p.variation.alibi.active();

  // Per-thread buffers, reused by every item the thread runs (a fresh 128 KiB score block per
  // item was a zeroing memset, and at that size glibc may hand out fresh mmap'd pages).
  struct ItemBuffers {
    ScratchFloats q, keys, panels, values, scores, acc, row_max, row_sum;
  };
  thread_local ItemBuffers b;
  // Gather Q rows: row = token * group + g.
  float* const q = b.q.Resize(rows * p.key_dim);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* src = p.q + (seq.first_row + item.query_begin + t) * p.q_row_stride +
                       int64_t{item.kv_head} * group * p.key_dim;
    std::copy(src, src + int64_t{group} * p.key_dim, q + t * group * p.key_dim);
  }
  // The tiles take the softmax scale with q (one multiply per q element, not per score).
  if (tiled && p.variation.scale != 1.0f) {
    for (int64_t i = 0; i < rows * p.key_dim; ++i) q[i] *= p.variation.scale;
  }
  float* const key_buffer =
      gathered != nullptr ? nullptr : b.keys.Resize(kKeysPerBlock * p.key_dim);
  float* const panel_buffer =
      gathered != nullptr || !tiled ? nullptr : b.panels.Resize(kKeysPerBlock * p.key_dim);
  float* const value_buffer =
      gathered != nullptr ? nullptr : b.values.Resize(kKeysPerBlock * p.value_dim);
  float* const scores = b.scores.Resize(rows * kKeysPerBlock);
  float* const acc = b.acc.Resize(rows * p.value_dim);
  float* const row_max = b.row_max.Resize(rows);
  float* const row_sum = b.row_sum.Resize(rows);
  std::fill_n(acc, rows * p.value_dim, 0.0f);
  std::fill_n(row_max, rows, kNegInf);
  std::fill_n(row_sum, rows, 0.0f);

  // Keys any query of the block may see; blocks beyond them (above the causal diagonal, before
  // the window) are never visited.
  const int64_t first_query = seq.first_index + item.query_begin;
  const int64_t last_query = seq.first_index + item.query_end - 1;
  const KeyRange first_visible = p.variation.mask.VisibleKeys(first_query, seq.length);
  const KeyRange last_visible = p.variation.mask.VisibleKeys(last_query, seq.length);
  const int64_t keys_begin = first_visible.begin;
  const int64_t keys_end = last_visible.end;

  // Gathered panels start at gathered->begin, so the tiled path's blocks start on that grid (the
  // keys before keys_begin in the first block are masked like any other invisible key).
  int64_t first_block = keys_begin;
  if (tiled && gathered != nullptr) {
    first_block -= (keys_begin - gathered->begin) % kKeyPanel;
  }
  for (int64_t block = first_block; block < keys_end; block += kKeysPerBlock) {
    const int64_t count = std::min(kKeysPerBlock, keys_end - block);
    // Row stride of the scores: whole panels on the tiled path.
    const int64_t ld = tiled ? (count + kKeyPanel - 1) / kKeyPanel * kKeyPanel : count;
    const float* keys;
    const float* values;
    if (gathered != nullptr) {
      keys = gathered->keys + (block - gathered->begin) * p.key_dim;
      values = gathered->values + (block - gathered->begin) * p.value_dim;
    } else {
      seq.source->Fill(item.kv_head, block, block + count, key_buffer, value_buffer);
      keys = key_buffer;
      values = value_buffer;
      if (tiled) {
        PackKeyPanels(keys, count, p.key_dim, panel_buffer);
        keys = panel_buffer;
      }
    }
    // Visible ranges only grow with the query index, so the block is seen whole by every row when
    // the first row sees its end and the last row its start: no per-row mask then.
    const bool whole = first_visible.end >= block + count && last_visible.begin <= block;
    // Mask, then the online-softmax update of rows [r0, r1); P overwrites S.
    auto softmax_rows = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* s = scores + r * ld;
        int64_t lo = 0, hi = count;
        if (!whole) {
          const KeyRange visible =
              p.variation.mask.VisibleKeys(first_query + r / group, seq.length);
          lo = std::clamp(visible.begin - block, int64_t{0}, count);
          hi = std::clamp(visible.end - block, int64_t{0}, count);
          if (lo >= hi) {
            std::fill(s, s + count, 0.0f);
            continue;
          }
        }
        const LogitSite site{item.kv_head * group + static_cast<int>(r % group),
                             first_query + r / group, block};
        OnlineSoftmaxRow(s, count, lo, hi, /*scale=*/1.0f, p.variation, site, &row_max[r],
                         &row_sum[r], acc + r * p.value_dim, p.value_dim);
      }
    };
    if (!tiled) {
      // S = scale * Q · K^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                  static_cast<int>(count), p.key_dim, p.variation.scale, q, p.key_dim, keys,
                  p.key_dim, 0.0f, scores, static_cast<int>(count));
      softmax_rows(0, rows);
      // O += P · V
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), p.value_dim,
                  static_cast<int>(count), 1.0f, scores, static_cast<int>(count), values,
                  p.value_dim, 1.0f, acc, p.value_dim);
      continue;
    }
    // Tiled: all rows at once for a whole block; row chunks for a block the diagonal crosses, each
    // chunk's tiles stopping after the last key its last row sees (the chunk's largest visible
    // end, as ends grow with the query index). Every score a softmax row reads is computed; the
    // softmax zero-fills the rest of the row, so P · V may stop at the same key.
    const int64_t chunk_rows = whole ? rows : kDiagonalChunkRows;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const int64_t r1 = std::min(rows, r0 + chunk_rows);
      int64_t chunk_count = count;
      if (!whole) {
        const KeyRange visible =
            p.variation.mask.VisibleKeys(first_query + (r1 - 1) / group, seq.length);
        chunk_count = std::clamp(visible.end - block, int64_t{0}, count);
      }
      // S = (scale * Q) · K^T, whole panels (the scores past chunk_count are never read).
      if (chunk_count > 0) {
        PanelScores(isa, q + r0 * p.key_dim, static_cast<int>(r1 - r0), p.key_dim, keys,
                    static_cast<int>((chunk_count + kKeyPanel - 1) / kKeyPanel), scores + r0 * ld,
                    ld);
      }
      if (plain && whole) {
        OnlineSoftmaxRows(scores + r0 * ld, ld, r1 - r0, count, row_max + r0, row_sum + r0,
                          acc + r0 * p.value_dim, p.value_dim);
      } else {
        softmax_rows(r0, r1);
      }
      // O += P · V
      if (chunk_count > 0) {
        TileAccumulate(isa, scores + r0 * ld, ld, static_cast<int>(r1 - r0), values,
                       static_cast<int>(chunk_count), p.value_dim, acc + r0 * p.value_dim);
      }
    }
  }

  // Normalise and scatter back: row (token t, group g) -> out[t, kv_head * group + g].
  for (int64_t t = 0; t < tokens; ++t) {
    for (int g = 0; g < group; ++g) {
      const int64_t r = t * group + g;
      float* dst = p.out + (seq.first_row + item.query_begin + t) * p.out_row_stride +
                   (int64_t{item.kv_head} * group + g) * p.value_dim;
      float sum = row_sum[r];
      const float acc_scale = p.variation.sinks.Join(item.kv_head * group + g, row_max[r], &sum);
      const float inv = sum > 0.0f ? acc_scale / sum : 0.0f;
      for (int d = 0; d < p.value_dim; ++d) dst[d] = acc[r * p.value_dim + d] * inv;
    }
  }
}

}  // namespace

void PrefillAttention(const PrefillAttentionParams& p, absl::Span<const PrefillSequence> sequences,
                      ThreadPool& pool) {
  const PrefillTileIsa isa = PrefillTileIsaFor(p.key_dim, p.value_dim);
  // Convert each (sequence, KV head)'s visible keys and values to float32 once, when that fits.
  int64_t gathered_floats = 0;
  std::vector<int64_t> gathered_offset(sequences.size() + 1, 0);
  for (size_t s = 0; s < sequences.size(); ++s) {
    const KeyRange keys = sequences[s].num_new > 0 ? SequenceKeys(p, sequences[s]) : KeyRange{};
    gathered_offset[s] = gathered_floats;
    const int64_t count = std::max<int64_t>(0, keys.end - keys.begin);
    gathered_floats +=
        p.num_kv_heads * (GatheredKeyFloats(isa, count, p.key_dim) + count * p.value_dim);
  }
  gathered_offset[sequences.size()] = gathered_floats;
  const bool gather = gathered_floats <= p.max_gathered_floats;
  // Not value-initialised: every float is written by the gather (zeroing 8 MiB at 2048 tokens
  // cost a measurable share of a prefill). Kept per calling thread up to
  // kMaxRetainedScratchFloats, so its pages are not faulted in again on every call.
  thread_local ScratchFloats storage;
  float* const storage_base = gather ? storage.Resize(gathered_floats) : nullptr;
  std::vector<GatheredKv> gathered(gather ? sequences.size() * p.num_kv_heads : 0);
  if (gather) {
    // One task per (sequence, KV head, run of kGatherChunkKeys keys): an MQA prefill's single
    // head is spread over every thread too.
    struct GatherTask {
      int sequence;
      int kv_head;
      int64_t begin;  // Keys [begin, end) of the sequence.
      int64_t end;
    };
    std::vector<GatherTask> tasks;
    for (size_t s = 0; s < sequences.size(); ++s) {
      if (sequences[s].num_new == 0) continue;
      const KeyRange keys = SequenceKeys(p, sequences[s]);
      const int64_t count = keys.end - keys.begin;
      const int64_t key_floats = GatheredKeyFloats(isa, count, p.key_dim);
      for (int h = 0; h < p.num_kv_heads; ++h) {
        float* base = storage_base + gathered_offset[s] + h * (key_floats + count * p.value_dim);
        gathered[s * p.num_kv_heads + h] = {keys.begin, base, base + key_floats};
        for (int64_t begin = keys.begin; begin < keys.end; begin += kGatherChunkKeys) {
          tasks.push_back({static_cast<int>(s), h, begin,
                           std::min(begin + kGatherChunkKeys, keys.end)});
        }
      }
    }
    pool.ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t i) {
      const GatherTask& task = tasks[i];
      const GatheredKv& kv = gathered[task.sequence * p.num_kv_heads + task.kv_head];
      // Chunks start kGatherChunkKeys apart from the range's start: on a panel boundary.
      const int64_t offset = task.begin - kv.begin;
      GatherKv(isa, *sequences[task.sequence].source, task.kv_head, task.begin, task.end,
               p.key_dim, kv.keys + offset * p.key_dim, kv.values + offset * p.value_dim);
    });
  }

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
  pool.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t i) {
    const WorkItem& item = items[i];
    const GatheredKv* kv =
        gather ? &gathered[static_cast<size_t>(item.sequence) * p.num_kv_heads + item.kv_head]
               : nullptr;
    AttendQueryBlock(p, isa, sequences[item.sequence], item, kv);
  });
  storage.Trim(kMaxRetainedScratchFloats);
}

}  // namespace attnserve

#include "tests/gpu/emulation_support.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace attnserve::cuda::emulation {

DType ToDType(KvType type) {
  switch (type) {
    case KvType::kF16:
      return DType::kF16;
    case KvType::kBF16:
      return DType::kBF16;
    case KvType::kF32:
    case KvType::kFp8:  // 8-bit pages: not among these tests' page types.
    case KvType::kInt8:
      break;
  }
  return DType::kF32;
}

int ElementBytes(KvType type) { return static_cast<int>(DTypeSize(ToDType(type))); }

// The engine's own conversions (kernels/core/tensor.h, round to nearest even), not the kernels'.
double StoreElement(float x, KvType type, void* dst) {
  ConvertFromFloat(&x, ToDType(type), dst, 1);
  return LoadElement(dst, type);
}

double LoadElement(const void* src, KvType type) {
  float x;
  ConvertToFloat(ToDType(type), src, &x, 1);
  return x;
}

uint64_t DrawCaseSeed(const std::string& case_name) {
  const uint64_t seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  std::printf("[case] %s seed=%" PRIu64 "\n", case_name.c_str(), seed);
  return seed;
}

double PagedBatch::PoolElement(int64_t element) const {
  return LoadElement(reinterpret_cast<const char*>(pool.data()) + element * ElementBytes(type),
                     type);
}

PagedKv PagedBatch::Kv() {
  PagedKv kv;
  kv.pool = pool.data();
  kv.page_offsets = page_offsets.data();
  kv.page_size = page_size;
  kv.num_kv_heads = kv_heads;
  kv.head_dim = head_dim;
  return kv;
}

PagedBatch LayOutPagedBatch(const std::vector<SequenceShape>& shapes, KvType type, int kv_heads,
                            int head_dim, int page_size, const MaskSpec& mask,
                            std::mt19937_64& rng) {
  PagedBatch batch;
  batch.type = type;
  batch.kv_heads = kv_heads;
  batch.head_dim = head_dim;
  batch.page_size = page_size;
  batch.mask = mask;
  std::vector<int> page_count;
  int total_pages = 0;
  for (const SequenceShape& shape : shapes) {
    SequenceDesc desc;
    desc.first_row = batch.rows;
    desc.num_new = shape.num_new;
    desc.first_index = shape.first_index;
    desc.length = shape.first_index + shape.num_new;
    desc.first_page = total_pages;
    batch.sequences.push_back(desc);
    const int pages = (desc.length + page_size - 1) / page_size;
    page_count.push_back(pages);
    batch.rows += shape.num_new;
    total_pages += pages;
  }
  batch.pool_pages = total_pages + 3;  // Spare pages stay NaN: a stray read or write shows.
  std::vector<int> slots(batch.pool_pages);
  for (int i = 0; i < batch.pool_pages; ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), rng);
  const int64_t page_bytes = batch.PageElements() * ElementBytes(type);
  batch.pool.assign(static_cast<size_t>(batch.pool_pages * page_bytes / 4), 0xFFFFFFFFu);
  batch.page_offsets.resize(static_cast<size_t>(total_pages));
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const SequenceDesc& desc = batch.sequences[b];
    int visible_from = 0;  // First key any new token sees.
    int unused;
    mask.VisibleKeys(desc.first_index, desc.length, &visible_from, &unused);
    for (int page = 0; page < page_count[b]; ++page) {
      const bool evicted = (page + 1) * page_size <= visible_from;
      batch.page_offsets[desc.first_page + page] =
          evicted ? -1 : int64_t{slots[desc.first_page + page]} * page_bytes;
    }
  }
  return batch;
}

PagedBatch MakePagedBatch(const std::vector<SequenceShape>& shapes, KvType type, int kv_heads,
                          int head_dim, int page_size, const MaskSpec& mask, std::mt19937_64& rng) {
  PagedBatch batch = LayOutPagedBatch(shapes, type, kv_heads, head_dim, page_size, mask, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int d = head_dim, element_bytes = ElementBytes(type);
  char* const pool_base = reinterpret_cast<char*>(batch.pool.data());
  const int64_t value_offset = int64_t{kv_heads} * page_size * d;  // V after K in a page.
  for (const SequenceDesc& desc : batch.sequences) {
    std::vector<std::vector<double>>& keys = batch.keys.emplace_back();
    std::vector<std::vector<double>>& values = batch.values.emplace_back();
    for (int j = 0; j < desc.length; ++j) {
      std::vector<double> k(static_cast<size_t>(kv_heads * d)), v(k.size());
      const int64_t offset = batch.page_offsets[desc.first_page + j / page_size];
      for (int h = 0; h < kv_heads; ++h) {
        for (int e = 0; e < d; ++e) {
          // The key was written once; if its page was evicted since, it went to scratch.
          const int64_t element = (int64_t{h} * page_size + j % page_size) * d + e;
          char scratch[4];
          char* const k_dst = offset < 0 ? scratch : pool_base + offset + element * element_bytes;
          char* const v_dst =
              offset < 0 ? scratch : pool_base + offset + (element + value_offset) * element_bytes;
          k[h * d + e] = StoreElement(normal(rng), type, k_dst);
          v[h * d + e] = StoreElement(normal(rng), type, v_dst);
        }
      }
      keys.push_back(std::move(k));
      values.push_back(std::move(v));
    }
  }
  return batch;
}

std::vector<float> RandomQueries(int rows, int64_t q_stride, int64_t q_width,
                                 std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(static_cast<size_t>(rows * q_stride), NAN);
  for (int r = 0; r < rows; ++r) {
    for (int64_t e = 0; e < q_width; ++e) qkv[r * q_stride + e] = normal(rng);
  }
  return qkv;
}

AttentionParams MakeAttentionParams(PagedBatch& batch, const std::vector<float>& qkv,
                                    int64_t q_stride, int heads, int group,
                                    std::vector<float>& out) {
  AttentionParams p;
  p.q = qkv.data();
  p.q_stride = q_stride;
  p.out = out.data();
  p.num_heads = heads;
  p.group = group;
  p.scale = 1.0f / std::sqrt(static_cast<float>(batch.head_dim));
  p.mask = batch.mask;
  p.kv = batch.Kv();
  p.sequences = batch.sequences.data();
  p.batch = static_cast<int>(batch.sequences.size());
  return p;
}

std::vector<double> ReferenceAttention(const PagedBatch& batch, const float* q, int64_t q_stride,
                                       int heads, int group, double scale, double soft_cap) {
  const int d = batch.head_dim;
  std::vector<double> expected(static_cast<size_t>(batch.rows) * heads * d);
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const SequenceDesc& desc = batch.sequences[b];
    const std::vector<std::vector<double>>& keys = batch.keys[b];
    const std::vector<std::vector<double>>& values = batch.values[b];
    for (int t = 0; t < desc.num_new; ++t) {
      int lo, hi;
      batch.mask.VisibleKeys(desc.first_index + t, desc.length, &lo, &hi);
      const int row = desc.first_row + t;
      for (int head = 0; head < heads; ++head) {
        const int h = head / group;
        std::vector<double> score;
        double max_score = -INFINITY;
        for (int j = lo; j < hi; ++j) {
          double dot = 0.0;
          for (int e = 0; e < d; ++e)
            dot += double{q[row * q_stride + head * d + e]} * keys[j][h * d + e];
          const double scaled = dot * scale;
          score.push_back(soft_cap > 0.0 ? soft_cap * std::tanh(scaled / soft_cap) : scaled);
          max_score = std::max(max_score, score.back());
        }
        double sum = 0.0;
        for (double& s : score) sum += (s = std::exp(s - max_score));
        for (int e = 0; e < d; ++e) {
          double acc = 0.0;
          for (int j = lo; j < hi; ++j) acc += score[j - lo] * values[j][h * d + e];
          expected[(int64_t{row} * heads + head) * d + e] = acc / sum;
        }
      }
    }
  }
  return expected;
}

OutputError CompareWithReference(const std::vector<float>& actual,
                                 const std::vector<double>& expected) {
  double diff = 0.0, norm = 0.0;
  int64_t nan_count = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double got = actual[i];
    if (std::isnan(got)) ++nan_count;
    diff += (got - expected[i]) * (got - expected[i]);
    norm += expected[i] * expected[i];
  }
  return {std::sqrt(diff / norm), nan_count};
}

}  // namespace attnserve::cuda::emulation

// The absorbed MLA attention kernels (kernels/cuda/mla/mla_attention.cuh) executed on the CPU by
// the block emulator, launched through the dispatch as CudaMlaLayer launches them, against a
// float64 reference computed from the same stored page values and the same fp32 queries:
//   prefill: causal rows (token, head) of new tokens over a cached prefix, ragged batch;
//   decode:  split-KV blocks (small minimum split so 300 keys make 4 splits with mid-page edges),
//            heads in row blocks of 16 (20 heads: two blocks), then the GQA combine.
// The pool is NaN except for the slots the sequences wrote, pages are scattered, the output and
// the decode's partials start NaN: a read of an unwritten slot or an unwritten output fails.
//
// Tolerance (relative 2-norm over the call): 2e-6 for every page type. The kernels load each
// stored element exactly into fp32 and do every product, exp and sum in fp32 (u = 2^-24) over
// rows of 96 to 576 elements; seen ~2e-7.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/core/tensor.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/mla/mla_dispatch.h"
#include "kernels/cuda/mla/mla_params.h"

namespace attnserve::cuda {
namespace {

struct Shape {
  int heads, latent, rope, page_size;
};

double RelativeError(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);  // NaN when any output is NaN.
}

void RunCase(const Shape& s, DType dtype, bool decode, uint64_t seed) {
  SCOPED_TRACE(absl::StrCat("heads ", s.heads, " ", s.latent, "+", s.rope, " page ", s.page_size,
                            " ", DTypeName(dtype), decode ? " decode" : " prefill", " seed ",
                            seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int width = s.latent + s.rope;
  const size_t elem = DTypeSize(dtype);
  // Sequences: (cached before, new); decode: one new token each.
  const std::vector<int> lengths = {1, 17, 70, 300};
  const std::vector<int> news = decode ? std::vector<int>{1, 1, 1, 1} : std::vector<int>{1, 5, 33, 20};
  // Pool: every page of every sequence at a scattered index, plus NaN pages in between.
  int total_pages = 0;
  for (int n : lengths) total_pages += (n + s.page_size - 1) / s.page_size;
  const int pool_pages = 2 * total_pages + 1;
  const size_t page_bytes = size_t(s.page_size) * width * elem;
  std::vector<std::byte> pool(pool_pages * page_bytes);
  std::memset(pool.data(), 0xFF, pool.size());  // NaN in every dtype.
  std::vector<int> order(pool_pages);
  for (int i = 0; i < pool_pages; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> page_offsets;
  std::vector<SequenceDesc> descs;
  std::vector<std::vector<std::vector<double>>> rows(lengths.size());  // Stored values, fp64.
  int row = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    SequenceDesc d;
    d.length = lengths[b];
    d.num_new = news[b];
    d.first_index = lengths[b] - news[b];
    d.first_row = row;
    d.first_page = static_cast<int>(page_offsets.size());
    row += news[b];
    const int pages = (lengths[b] + s.page_size - 1) / s.page_size;
    for (int p = 0; p < pages; ++p) {
      page_offsets.push_back(int64_t{order[page_offsets.size()]} * int64_t(page_bytes));
    }
    for (int t = 0; t < lengths[b]; ++t) {
      std::vector<float> values(width);
      for (float& v : values) v = uniform(rng);
      std::byte* slot = pool.data() + page_offsets[d.first_page + t / s.page_size] +
                        size_t(t % s.page_size) * width * elem;
      ConvertFromFloat(values.data(), dtype, slot, width);
      std::vector<float> stored(width);
      ConvertToFloat(dtype, slot, stored.data(), width);
      rows[b].emplace_back(stored.begin(), stored.end());
    }
    descs.push_back(d);
  }
  const int total_rows = row;
  std::vector<float> q(size_t(total_rows) * s.heads * width);
  for (float& v : q) v = uniform(rng);
  const float scale = 0.125f;
  const MaskSpec mask{1, 0};

  // The layer's plan: every head a query row of one KV head.
  std::vector<WorkItem> items;
  std::vector<int> item_begin;
  for (size_t b = 0; b < descs.size(); ++b) {
    item_begin.push_back(static_cast<int>(items.size()));
    if (decode) {
      PlanDecodeSplits(descs[b], static_cast<int>(b), mask, /*max_splits=*/4,
                       /*min_keys_per_split=*/64, items);
    } else {
      PlanPrefillItems(descs[b], static_cast<int>(b), s.heads, mask, kMlaRowsPerBlock, items);
    }
  }
  item_begin.push_back(static_cast<int>(items.size()));
  std::vector<float> out(size_t(total_rows) * s.heads * s.latent, NAN);
  const size_t partial_rows = decode ? items.size() * s.heads : 0;
  std::vector<float> pmax(partial_rows, NAN), psum(partial_rows, NAN),
      pacc(partial_rows * s.latent, NAN);

  MlaAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.num_heads = s.heads;
  p.scale = scale;
  p.mask = mask;
  p.kv = MlaPagedKv{pool.data(), page_offsets.data(), s.page_size, s.latent, s.rope};
  p.sequences = descs.data();
  p.batch = static_cast<int>(descs.size());
  p.items = items.data();
  p.num_items = static_cast<int>(items.size());
  if (decode) {
    p.partial_max = pmax.data();
    p.partial_sum = psum.data();
    p.partial_acc = pacc.data();
    p.item_begin = item_begin.data();
    ASSERT_TRUE(RunMlaDecodeAttention(dtype, p, nullptr).ok());
  } else {
    ASSERT_TRUE(RunMlaPrefillAttention(dtype, p, nullptr).ok());
  }

  // float64: softmax over the visible stored rows, value = the row's first `latent` elements.
  std::vector<double> want(out.size());
  for (size_t b = 0; b < descs.size(); ++b) {
    const SequenceDesc& d = descs[b];
    for (int t = 0; t < d.num_new; ++t) {
      int lo, hi;
      mask.VisibleKeys(d.first_index + t, d.length, &lo, &hi);
      for (int h = 0; h < s.heads; ++h) {
        const float* qr = &q[(size_t(d.first_row + t) * s.heads + h) * width];
        std::vector<double> scores;
        double m = -INFINITY;
        for (int k = lo; k < hi; ++k) {
          double dot = 0.0;
          for (int e = 0; e < width; ++e) dot += double(qr[e]) * rows[b][k][e];
          scores.push_back(dot * scale);
          m = std::max(m, scores.back());
        }
        double sum = 0.0;
        for (double& x : scores) sum += (x = std::exp(x - m));
        double* o = &want[(size_t(d.first_row + t) * s.heads + h) * s.latent];
        for (int k = lo; k < hi; ++k) {
          for (int e = 0; e < s.latent; ++e) o[e] += scores[k - lo] / sum * rows[b][k][e];
        }
      }
    }
  }
  const double err = RelativeError(out, want);
  std::printf("[mla kernel] heads %d %d+%d page %d %s %s: %.3g\n", s.heads, s.latent, s.rope,
              s.page_size, std::string(DTypeName(dtype)).c_str(), decode ? "decode" : "prefill",
              err);
  EXPECT_LE(err, 2e-6);  // NaN fails.
  if (decode) {
    EXPECT_GT(items.size(), descs.size()) << "no sequence was split";
  }
}

TEST(MlaAttentionEmulationTest, PrefillMatchesFloat64) {
  const uint64_t seed = std::random_device{}();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    RunCase({4, 64, 32, 16}, dtype, /*decode=*/false, seed);
  }
  RunCase({20, 32, 16, 64}, DType::kBF16, /*decode=*/false, seed);
}

TEST(MlaAttentionEmulationTest, SplitKvDecodeMatchesFloat64) {
  const uint64_t seed = std::random_device{}();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    RunCase({20, 64, 32, 16}, dtype, /*decode=*/true, seed);
  }
  // DeepSeek's widths (512 + 64: the 105 KB tile), few heads to keep the emulator quick.
  RunCase({4, 512, 64, 64}, DType::kBF16, /*decode=*/true, seed);
}

}  // namespace
}  // namespace attnserve::cuda

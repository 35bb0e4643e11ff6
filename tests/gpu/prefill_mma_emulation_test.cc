// The tensor-core prefill kernel (kernels/cuda/attention/prefill_mma.cuh) executed on the CPU by
// the block emulator (simt_emulator.h: one host thread per CUDA thread, mma.sync emulated from
// the PTX fragment layouts), against a float64 reference. This runs in CI, which has no GPU: it
// checks the kernel's fragment indexing, paged gather, masks, online softmax and work plan; the
// GPU run (tests/gpu/cuda_backend_test) checks the same source compiled by nvcc.
//
// Every case is drawn fresh (the seed is printed). The KV pool is NaN except for the slots the
// sequences wrote, pages are scattered in the pool, pages behind a sliding window are evicted
// (-1), the q buffer's K/V columns are NaN and the output starts NaN: a read of anything the
// kernel must not read, or a row it fails to write, turns into NaN and fails.
//
// Lengths cross the 64-key tile, the page (16 or 5 tokens), the 64-row block and 16-row warp
// edges, and the window (40); batches are ragged and include a continuation (first_index > 0).
//
// Tolerances (relative 2-norm over the call against float64 with unrounded Q):
//   f16:  1e-3 ~ 2 u, u = 2^-11: Q and P are rounded to f16 for the mma (K/V are already f16,
//                             and the reference uses the same rounded K/V); seen: ~2e-4.
//   bf16: 8e-3 ~ 2 u, u = 2^-8, for the same two roundings; seen: ~2e-3.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/prefill_mma.cuh"
#include "kernels/cuda/attention/simt_emulator.h"
#include "kernels/cuda/attention/work_plan.h"

namespace attnserve::cuda {
namespace {

using simt::Half16;

constexpr uint16_t kNaNBits = 0xFFFF;  // NaN in f16 and bf16.

uint16_t ToBits(float x, Half16 type) {
  if (type == Half16::kF16) return static_cast<__half_raw>(__float2half_rn(x)).x;
  return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(x)).x;
}

double FromBits(uint16_t bits, Half16 type) {
  if (type == Half16::kF16) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

struct SequenceShape {
  int first_index;  // Tokens already cached.
  int num_new;
};

struct Case {
  std::string name;
  Half16 type;
  int head_dim;
  int group;
  MaskSpec mask;
  int page_size;
  std::vector<SequenceShape> sequences;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

template <Half16 kType, int kHeadDim>
void RunBlockOnCpu(const AttentionParams& p, int item, int kv_head) {
  auto storage = std::make_unique<MmaPrefillStorage<kHeadDim>>();
  std::memset(storage.get(), 0xFF, sizeof(*storage));  // Shared memory starts as garbage.
  simt::emulator::RunBlock(kMmaPrefillThreads,
                           [&] { MmaPrefillBlock<kType, kHeadDim>(p, item, kv_head, *storage); });
}

void RunBlockOnCpu(Half16 type, int head_dim, const AttentionParams& p, int item, int kv_head) {
  if (type == Half16::kF16) {
    head_dim == 64 ? RunBlockOnCpu<Half16::kF16, 64>(p, item, kv_head)
                   : RunBlockOnCpu<Half16::kF16, 128>(p, item, kv_head);
  } else {
    head_dim == 64 ? RunBlockOnCpu<Half16::kBF16, 64>(p, item, kv_head)
                   : RunBlockOnCpu<Half16::kBF16, 128>(p, item, kv_head);
  }
}

class MmaPrefillEmulationTest : public ::testing::TestWithParam<Case> {};

TEST_P(MmaPrefillEmulationTest, MatchesFloat64Reference) {
  const Case& c = GetParam();
  const uint64_t seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::printf("[case] %s seed=%" PRIu64 "\n", c.name.c_str(), seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  const int kv_heads = 2, heads = kv_heads * c.group, d = c.head_dim;
  const int64_t q_stride = int64_t{heads} * d + 2 * int64_t{kv_heads} * d;  // As the qkv buffer.
  const int64_t page_elements = 2 * int64_t{kv_heads} * c.page_size * d;

  // ---- Sequences, their pages scattered over a NaN pool, evicted pages behind the window.
  std::vector<SequenceDesc> descs;
  std::vector<int> page_count;
  int rows = 0, total_pages = 0;
  for (const SequenceShape& shape : c.sequences) {
    SequenceDesc desc;
    desc.first_row = rows;
    desc.num_new = shape.num_new;
    desc.first_index = shape.first_index;
    desc.length = shape.first_index + shape.num_new;
    desc.first_page = total_pages;
    descs.push_back(desc);
    const int pages = (desc.length + c.page_size - 1) / c.page_size;
    page_count.push_back(pages);
    rows += shape.num_new;
    total_pages += pages;
  }
  const int pool_pages = total_pages + 3;  // Spare pages stay NaN.
  std::vector<int> slots(pool_pages);
  for (int i = 0; i < pool_pages; ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<uint16_t> pool(static_cast<size_t>(pool_pages * page_elements), kNaNBits);
  std::vector<int64_t> page_offsets(static_cast<size_t>(total_pages));
  // keys[b][j] / values[b][j]: the head_dim-vector of key j of KV head h at [h * d].
  std::vector<std::vector<std::vector<double>>> keys(descs.size()), values(descs.size());
  for (size_t b = 0; b < descs.size(); ++b) {
    const SequenceDesc& desc = descs[b];
    int visible_from = 0;  // First key any new token sees.
    int unused;
    c.mask.VisibleKeys(desc.first_index, desc.length, &visible_from, &unused);
    for (int page = 0; page < page_count[b]; ++page) {
      const bool evicted = (page + 1) * c.page_size <= visible_from;
      page_offsets[desc.first_page + page] =
          evicted
              ? -1
              : int64_t{slots[desc.first_page + page]} * page_elements * int64_t{sizeof(uint16_t)};
    }
    for (int j = 0; j < desc.length; ++j) {
      std::vector<double> k(static_cast<size_t>(kv_heads * d)), v(k.size());
      const int64_t offset = page_offsets[desc.first_page + j / c.page_size];
      for (int h = 0; h < kv_heads; ++h) {
        for (int e = 0; e < d; ++e) {
          const uint16_t kb = ToBits(normal(rng), c.type), vb = ToBits(normal(rng), c.type);
          k[h * d + e] = FromBits(kb, c.type);
          v[h * d + e] = FromBits(vb, c.type);
          if (offset < 0) continue;  // The key was written once, then its page evicted.
          const int64_t element = offset / 2 + (int64_t{h} * c.page_size + j % c.page_size) * d + e;
          pool[element] = kb;
          pool[element + int64_t{kv_heads} * c.page_size * d] = vb;
        }
      }
      keys[b].push_back(std::move(k));
      values[b].push_back(std::move(v));
    }
  }

  // ---- q (its K/V columns NaN: a wrong stride reads them), output NaN.
  std::vector<float> qkv(static_cast<size_t>(rows * q_stride), NAN);
  for (int r = 0; r < rows; ++r) {
    for (int e = 0; e < heads * d; ++e) qkv[r * q_stride + e] = normal(rng);
  }
  std::vector<float> out(static_cast<size_t>(rows) * heads * d, NAN);

  // ---- Plan as the CUDA layer does and run every block on the emulator.
  std::vector<WorkItem> items;
  for (size_t b = 0; b < descs.size(); ++b) {
    PlanPrefillItems(descs[b], static_cast<int>(b), c.group, c.mask, kMmaPrefillRows, items);
  }
  AttentionParams p;
  p.q = qkv.data();
  p.q_stride = q_stride;
  p.out = out.data();
  p.num_heads = heads;
  p.group = c.group;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.mask = c.mask;
  p.kv.pool = pool.data();
  p.kv.page_offsets = page_offsets.data();
  p.kv.page_size = c.page_size;
  p.kv.num_kv_heads = kv_heads;
  p.kv.head_dim = d;
  p.sequences = descs.data();
  p.batch = static_cast<int>(descs.size());
  p.items = items.data();
  p.num_items = static_cast<int>(items.size());
  for (int item = 0; item < p.num_items; ++item) {
    for (int h = 0; h < kv_heads; ++h) RunBlockOnCpu(c.type, d, p, item, h);
  }

  // ---- float64 reference with the unrounded q.
  std::vector<double> expected(out.size()), actual(out.begin(), out.end());
  for (size_t b = 0; b < descs.size(); ++b) {
    const SequenceDesc& desc = descs[b];
    for (int t = 0; t < desc.num_new; ++t) {
      int lo, hi;
      c.mask.VisibleKeys(desc.first_index + t, desc.length, &lo, &hi);
      const int row = desc.first_row + t;
      for (int head = 0; head < heads; ++head) {
        const int h = head / c.group;
        std::vector<double> score;
        double max_score = -INFINITY;
        for (int j = lo; j < hi; ++j) {
          double dot = 0.0;
          for (int e = 0; e < d; ++e)
            dot += double{qkv[row * q_stride + head * d + e]} * keys[b][j][h * d + e];
          score.push_back(dot * p.scale);
          max_score = std::max(max_score, score.back());
        }
        double sum = 0.0;
        for (double& s : score) sum += (s = std::exp(s - max_score));
        for (int e = 0; e < d; ++e) {
          double acc = 0.0;
          for (int j = lo; j < hi; ++j) acc += score[j - lo] * values[b][j][h * d + e];
          expected[(int64_t{row} * heads + head) * d + e] = acc / sum;
        }
      }
    }
  }
  double diff = 0.0, norm = 0.0;
  int64_t nan_count = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::isnan(actual[i])) ++nan_count;
    diff += (actual[i] - expected[i]) * (actual[i] - expected[i]);
    norm += expected[i] * expected[i];
  }
  EXPECT_EQ(nan_count, 0) << "outputs left unwritten or computed from poisoned memory";
  const double error = std::sqrt(diff / norm);
  const double bound = c.type == Half16::kF16 ? 1e-3 : 8e-3;
  std::printf("[result] %s: %d rows x %d heads, %d items, relative error %.3e (bound %.1e)\n",
              c.name.c_str(), rows, heads, p.num_items, error, bound);
  EXPECT_LE(error, bound);
}

const MaskSpec kCausal{1, 0};
const MaskSpec kWindow40{1, 40};
const MaskSpec kNonCausal{0, 0};

// Ragged: a fresh 70-token prompt (crosses the 64-key tile and 64-row block), a continuation of
// 33 tokens after 37 cached, and a 1-token prompt.
const std::vector<SequenceShape> kRagged = {{0, 70}, {37, 33}, {0, 1}};

INSTANTIATE_TEST_SUITE_P(
    Shapes, MmaPrefillEmulationTest,
    ::testing::Values(
        Case{"f16_hd64_mha_causal_page16", Half16::kF16, 64, 1, kCausal, 16, kRagged},
        Case{"bf16_hd128_gqa3_causal_page16", Half16::kBF16, 128, 3, kCausal, 16, kRagged},
        Case{"f16_hd128_gqa4_window40_page16",
             Half16::kF16,
             128,
             4,
             kWindow40,
             16,
             {{0, 90}, {60, 20}}},
        Case{"bf16_hd64_mqa8_window40_page5",
             Half16::kBF16,
             64,
             8,
             kWindow40,
             5,
             {{50, 30}, {0, 9}}},
        Case{"bf16_hd64_noncausal_page16", Half16::kBF16, 64, 2, kNonCausal, 16, kRagged},
        Case{"f16_hd64_gqa5_causal_page5", Half16::kF16, 64, 5, kCausal, 5, {{3, 27}, {0, 13}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace attnserve::cuda

// The tensor-core prefill kernel (kernels/cuda/attention/prefill_mma.cuh) executed on the CPU by
// the block emulator (simt_emulator.h: one fiber per CUDA thread, mma.sync emulated from
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
#include <cmath>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/work_plan.h"
#include "tests/gpu/emulation_support.h"

namespace attnserve::cuda {
namespace {

using emulation::SequenceShape;
struct Case {
  std::string name;
  KvType type;  // kF16 or kBF16: the tensor-core prefill takes 16-bit pages.
  int head_dim;
  int group;
  MaskSpec mask;
  int page_size;
  std::vector<SequenceShape> sequences;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class MmaPrefillEmulationTest : public ::testing::TestWithParam<Case> {};

TEST_P(MmaPrefillEmulationTest, MatchesFloat64Reference) {
  const Case& c = GetParam();
  const uint64_t seed = emulation::DrawCaseSeed(c.name);
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);

  const int kv_heads = 2, heads = kv_heads * c.group, d = c.head_dim;
  const int64_t q_stride = int64_t{heads} * d + 2 * int64_t{kv_heads} * d;  // As the qkv buffer.

  // ---- Sequences, their pages scattered over a NaN pool, evicted pages behind the window; q
  // (its K/V columns NaN), output NaN.
  emulation::PagedBatch batch =
      emulation::MakePagedBatch(c.sequences, c.type, kv_heads, d, c.page_size, c.mask, rng);
  const int rows = batch.rows;
  const std::vector<float> qkv = emulation::RandomQueries(rows, q_stride, heads * d, rng);
  std::vector<float> out(static_cast<size_t>(rows) * heads * d, NAN);

  // ---- Plan as the CUDA layer does and run every block on the emulator.
  std::vector<WorkItem> items;
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    PlanPrefillItems(batch.sequences[b], static_cast<int>(b), c.group, c.mask, kMmaPrefillRows,
                     items);
  }
  AttentionParams p = emulation::MakeAttentionParams(batch, qkv, q_stride, heads, c.group, out);
  p.items = items.data();
  p.num_items = static_cast<int>(items.size());
  // As the layer launches it: the dispatch picks the tensor-core kernel for 16-bit pages.
  ASSERT_TRUE(RunPrefillAttention(emulation::ToDType(c.type), d, p, nullptr).ok());

  // ---- float64 reference with the unrounded q.
  const emulation::OutputError error = emulation::CompareWithReference(
      out, emulation::ReferenceAttention(batch, qkv.data(), q_stride, heads, c.group, p.scale));
  EXPECT_EQ(error.nan_count, 0) << "outputs left unwritten or computed from poisoned memory";
  const double bound = c.type == KvType::kF16 ? 1e-3 : 8e-3;
  std::printf("[result] %s: %d rows x %d heads, %d items, relative error %.3e (bound %.1e)\n",
              c.name.c_str(), rows, heads, p.num_items, error.relative, bound);
  EXPECT_LE(error.relative, bound);
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
        Case{"f16_hd64_mha_causal_page16", KvType::kF16, 64, 1, kCausal, 16, kRagged},
        Case{"bf16_hd128_gqa3_causal_page16", KvType::kBF16, 128, 3, kCausal, 16, kRagged},
        Case{"f16_hd128_gqa4_window40_page16",
             KvType::kF16,
             128,
             4,
             kWindow40,
             16,
             {{0, 90}, {60, 20}}},
        Case{"bf16_hd64_mqa8_window40_page5",
             KvType::kBF16,
             64,
             8,
             kWindow40,
             5,
             {{50, 30}, {0, 9}}},
        Case{"bf16_hd64_noncausal_page16", KvType::kBF16, 64, 2, kNonCausal, 16, kRagged},
        Case{"f16_hd64_gqa5_causal_page5", KvType::kF16, 64, 5, kCausal, 5, {{3, 27}, {0, 13}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace attnserve::cuda

// The decode-step projections (kernels/cpu/linear.h, LinearForward's few-rows path)
// against a float64 dot product, f32 and bf16 weights, over every row tile (1-8 rows), input
// widths that leave a tail after the 8- and 16-wide vectors (AVX2, AVX-512) and the 32-wide bf16
// blocks of AVX-512 (83 = 2 x 32 + 16 + 3), feature ranges that
// start and end mid-tile, and strided rows. ctest runs it three times: on the path this CPU
// chooses, with ATTNSERVE_CPU_AVX512=0 (AVX2) and with ATTNSERVE_CPU_PORTABLE=1. Output slots outside the asked range are poisoned with NaN and must stay so.
//
// Tolerance: f32 accumulation of n products is within n * 2^-24 * sum_i |x_i w_i| of the exact
// sum (the classic gamma_n bound; the bias add is one more rounding, so n + 1 is used), with w
// the weight as kept: bf16 weights are compared against the bf16-rounded values, which are what
// the kernel multiplies by (widening bf16 to f32 is exact).
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/tensor.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/thread_pool.h"

namespace attnserve {
namespace {

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

struct Problem {
  int64_t rows, in, out, ldx, ldy;
  std::vector<float> x, w, bias, y;
};

Problem MakeProblem(int64_t rows, int64_t in, int64_t out, bool round_to_bf16, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal;
  Problem p{rows, in, out, in + 3, out + 2, {}, {}, {}, {}};
  p.x.resize(rows * p.ldx);
  p.w.resize(out * in);
  p.bias.resize(out);
  for (float& v : p.x) v = normal(rng);
  for (float& v : p.w) v = round_to_bf16 ? BF16ToFloat(FloatToBF16(normal(rng))) : normal(rng);
  for (float& v : p.bias) v = normal(rng);
  p.y.assign(rows * p.ldy, kPoison);
  return p;
}

// Checks y against the float64 sums over [o_begin, o_end) and NaN everywhere else.
void ExpectMatches(const Problem& p, bool with_bias, int64_t o_begin, int64_t o_end) {
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t o = 0; o < p.ldy; ++o) {
      const float got = p.y[r * p.ldy + o];
      if (o < o_begin || o >= o_end) {
        EXPECT_TRUE(std::isnan(got)) << "row " << r << " slot " << o << " written";
        continue;
      }
      double exact = with_bias ? p.bias[o] : 0.0, magnitude = std::abs(exact);
      for (int64_t i = 0; i < p.in; ++i) {
        const double product = double{p.x[r * p.ldx + i]} * p.w[o * p.in + i];
        exact += product;
        magnitude += std::abs(product);
      }
      const double bound = static_cast<double>(p.in + 1) * std::ldexp(1.0, -24) * magnitude;
      EXPECT_NEAR(got, exact, bound)
          << "row " << r << " feature " << o << " of " << p.rows << " x " << p.in;
    }
  }
}

std::vector<uint16_t> Bf16Bits(const std::vector<float>& w) {
  std::vector<uint16_t> bits(w.size());
  for (size_t i = 0; i < w.size(); ++i) bits[i] = FloatToBF16(w[i]);
  return bits;
}

TEST(SmallBatchGemvTest, EveryRowTileTailAndRangeMatchesFloat64) {
  uint64_t seed = 1;
  for (int64_t rows = 1; rows <= kGemvMaxRows + 3; ++rows) {
    for (int64_t in : {5, 37, 64, 83}) {
      for (bool bf16 : {false, true}) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "rows " << rows << " in " << in << " bf16 " << bf16
                                            << " bias " << with_bias);
          Problem p = MakeProblem(rows, in, /*out=*/13, bf16, ++seed);
          const float* bias = with_bias ? p.bias.data() : nullptr;
          // Features [1, 12): starts and ends inside the 2-, 4- and 8-wide feature tiles.
          if (bf16) {
            const std::vector<uint16_t> bits = Bf16Bits(p.w);
            SmallBatchGemv(p.x.data(), p.ldx, rows, bits.data(), in, bias, 1, 12, p.y.data(),
                           p.ldy);
          } else {
            SmallBatchGemv(p.x.data(), p.ldx, rows, p.w.data(), in, bias, 1, 12, p.y.data(), p.ldy);
          }
          ExpectMatches(p, with_bias, 1, 12);
        }
      }
    }
  }
}

// Large enough to be split into chunks over the pool's threads; every chunk must land in place.
TEST(SmallBatchGemvTest, LinearForwardSplitAcrossThreadsMatchesFloat64) {
  ThreadPool pool(3);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t rows : {int64_t{1}, int64_t{3}, kGemvMaxRows}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " rows " << rows);
      // On 3 threads: chunks of 48, 40, 40, 32, ... features, then of 8, the last of 2
      // (330 = 41 x 8 + 2), each tile prefetching the next only up to its chunk's end.
      const int64_t in = 584, out = 330;
      Problem p = MakeProblem(rows, in, out, dtype == DType::kBF16, 100 + rows);
      const ProjectionWeight weight(p.w, out, in, dtype);
      LinearForward(p.x.data(), p.ldx, rows, weight, p.bias.data(), p.y.data(), p.ldy, pool);
      ExpectMatches(p, /*with_bias=*/true, 0, out);
    }
  }
}

}  // namespace
}  // namespace attnserve

// Scalar f16/bf16 conversions against known IEEE bit patterns and an independent reference.
//
// The reference rounds by enumeration: it sorts every finite value of the 16-bit format and picks
// the nearest one (ties to the even bit pattern), which shares no code with the bit tricks in
// kernels/core/tensor.{h,cc}.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/tensor.h"

namespace attnserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float Bits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t Bits(float value) { return std::bit_cast<uint32_t>(value); }

// Every finite non-negative value of a 16-bit format in increasing order, with its bit pattern,
// followed by one virtual value, max + ulp, whose pattern is infinity: magnitudes from there on
// overflow, and the tie between max (an odd pattern) and it goes to infinity, as IEEE requires.
struct Grid {
  std::vector<double> values;
  std::vector<uint16_t> bits;
};

Grid MakeGrid(float (*to_float)(uint16_t), uint16_t max_finite_bits, uint16_t inf_bits) {
  Grid grid;
  for (uint32_t b = 0; b <= max_finite_bits; ++b) {
    grid.values.push_back(to_float(static_cast<uint16_t>(b)));
    grid.bits.push_back(static_cast<uint16_t>(b));
  }
  const double max = grid.values.back();
  grid.values.push_back(max + (max - grid.values[grid.values.size() - 2]));
  grid.bits.push_back(inf_bits);
  return grid;
}

// Round-to-nearest-even of a finite float onto `grid`, computed in double by enumeration.
uint16_t ReferenceRound(const Grid& grid, float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double magnitude = std::fabs(static_cast<double>(value));
  if (magnitude >= grid.values.back()) return sign | grid.bits.back();
  const auto upper = std::lower_bound(grid.values.begin(), grid.values.end(), magnitude);
  const size_t hi = static_cast<size_t>(upper - grid.values.begin());
  if (grid.values[hi] == magnitude) return sign | grid.bits[hi];
  const size_t lo = hi - 1;
  const double below = magnitude - grid.values[lo];
  const double above = grid.values[hi] - magnitude;
  if (below < above) return sign | grid.bits[lo];
  if (above < below) return sign | grid.bits[hi];
  return sign | ((grid.bits[lo] & 1) == 0 ? grid.bits[lo] : grid.bits[hi]);
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  // Not a DType (e.g. a byte from a file): no size, rather than the 2 of a 16-bit type.
  EXPECT_EQ(DTypeSize(static_cast<DType>(7)), 0u);
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(*ParseDType("BFloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("half"), DType::kF16);
  EXPECT_EQ(*ParseDType("F32"), DType::kF32);
  EXPECT_EQ(ParseDType("fp8").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BF16Test, KnownBitPatterns) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBF16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBF16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBF16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBF16(3.14159265f), 0x4049);  // PyTorch: torch.tensor(math.pi).bfloat16()
  EXPECT_EQ(BF16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BF16ToFloat(0x4049), 3.140625f);
}

TEST(BF16Test, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBF16(Bits(0x3f807fffu)), 0x3f80);  // Just below the halfway point.
  EXPECT_EQ(FloatToBF16(Bits(0x3f808000u)), 0x3f80);  // Tie, 0x3f80 is even: down.
  EXPECT_EQ(FloatToBF16(Bits(0x3f808001u)), 0x3f81);  // Just above: up.
  EXPECT_EQ(FloatToBF16(Bits(0x3f818000u)), 0x3f82);  // Tie, 0x3f81 is odd: up.
  EXPECT_EQ(FloatToBF16(Bits(0xbf818000u)), 0xbf82);  // Same for negatives.
  // Carry into the exponent: the largest mantissa rounds up to the next power of two.
  EXPECT_EQ(FloatToBF16(Bits(0x3fffc000u)), 0x4000);
}

TEST(BF16Test, InfinityNaNAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBF16(inf), 0x7f80);
  EXPECT_EQ(FloatToBF16(-inf), 0xff80);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7f80);  // Rounds past bf16 max.
  EXPECT_EQ(FloatToBF16(Bits(0x7f7f7fffu)), 0x7f7f);                  // Stays finite.
  EXPECT_TRUE(std::isinf(BF16ToFloat(0x7f80)));
  // A NaN whose payload sits only in the low 16 bits must stay NaN, not truncate to infinity.
  const uint16_t quieted = FloatToBF16(Bits(0x7f800001u));
  EXPECT_EQ(quieted & 0x7f80, 0x7f80);
  EXPECT_NE(quieted & 0x007f, 0);
  EXPECT_EQ(FloatToBF16(Bits(0xffc00000u)), 0xffc0);  // Sign of a NaN is kept.
  EXPECT_TRUE(std::isnan(BF16ToFloat(0x7fc0)));
  EXPECT_TRUE(std::isnan(BF16ToFloat(0x7f81)));
}

TEST(BF16Test, Subnormals) {
  EXPECT_EQ(BF16ToFloat(0x0001), Bits(0x00010000u));  // Smallest bf16 subnormal, 2^-133.
  EXPECT_EQ(FloatToBF16(Bits(0x00010000u)), 0x0001);
  EXPECT_EQ(FloatToBF16(Bits(0x00008000u)), 0x0000);  // Tie between 0 and 0x0001: even.
  EXPECT_EQ(FloatToBF16(Bits(0x00018000u)), 0x0002);  // Tie between 1 and 2: even.
  EXPECT_EQ(FloatToBF16(Bits(0x00000001u)), 0x0000);
  EXPECT_EQ(FloatToBF16(Bits(0x007fffffu)), 0x0080);  // Largest float subnormal -> min normal.
}

TEST(BF16Test, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float value = BF16ToFloat(bits);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(value)))) << std::hex << b;
    } else {
      EXPECT_EQ(FloatToBF16(value), bits) << std::hex << b;
    }
  }
}

TEST(BF16Test, MatchesEnumerationReference) {
  const Grid grid = MakeGrid(BF16ToFloat, 0x7f7f, 0x7f80);
  std::mt19937 rng(7);
  // Every midpoint between neighbours and one float ulp either side: the cases that decide RNE.
  for (size_t i = 0; i + 1 < grid.values.size(); ++i) {
    const float mid = static_cast<float>((grid.values[i] + grid.values[i + 1]) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)}) {
      ASSERT_EQ(FloatToBF16(x), ReferenceRound(grid, x)) << x;
      ASSERT_EQ(FloatToBF16(-x), ReferenceRound(grid, -x)) << -x;
    }
  }
  for (int i = 0; i < 200000; ++i) {
    const float x = Bits(static_cast<uint32_t>(rng()));
    if (std::isnan(x) || std::isinf(x)) continue;
    ASSERT_EQ(FloatToBF16(x), ReferenceRound(grid, x)) << std::hex << Bits(x);
  }
}

TEST(F16Test, KnownBitPatterns) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(0.5f), 0x3800);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);  // Largest finite half.
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(3.14159265f), 0x4248);  // numpy.float16(math.pi)
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
}

TEST(F16Test, RoundsToNearestEven) {
  const float ulp = std::ldexp(1.0f, -10);             // Half's ulp at 1.0.
  EXPECT_EQ(FloatToHalf(1.0f + ulp / 2), 0x3c00);      // Tie, 0x3c00 even: down.
  EXPECT_EQ(FloatToHalf(1.0f + 3 * ulp / 2), 0x3c02);  // Tie, 0x3c01 odd: up.
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + ulp / 2, 2.0f)), 0x3c01);
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + 3 * ulp / 2, 0.0f)), 0x3c01);
  EXPECT_EQ(FloatToHalf(-(1.0f + 3 * ulp / 2)), 0xbc02);
  EXPECT_EQ(FloatToHalf(2047.0f / 1024.0f + ulp / 2), 0x4000);  // Carry into the exponent.
}

TEST(F16Test, OverflowInfinityAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);  // Below max + ulp/2 = 65520: stays finite.
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);   // The tie rounds to even, which is infinity.
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(inf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-inf), 0xfc00);
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_LT(HalfToFloat(0xfc00), 0.0f);
  const uint16_t nan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  // A NaN whose payload would be shifted out must not become infinity.
  EXPECT_NE(FloatToHalf(Bits(0x7f800001u)) & 0x03ff, 0);
  EXPECT_EQ(FloatToHalf(Bits(0xffc00000u)) & 0x8000, 0x8000);
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7c01)));
}

TEST(F16Test, Subnormals) {
  const float min_subnormal = std::ldexp(1.0f, -24);
  EXPECT_EQ(FloatToHalf(min_subnormal), 0x0001);
  EXPECT_EQ(HalfToFloat(0x0001), min_subnormal);
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * min_subnormal);   // Largest subnormal.
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));  // Smallest normal.
  EXPECT_EQ(HalfToFloat(0x8001), -min_subnormal);
  EXPECT_EQ(FloatToHalf(1023 * min_subnormal), 0x03ff);
  EXPECT_EQ(FloatToHalf(min_subnormal / 2), 0x0000);  // Tie to even zero.
  EXPECT_EQ(FloatToHalf(std::nextafter(min_subnormal / 2, 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(-min_subnormal / 2), 0x8000);       // Signed zero.
  EXPECT_EQ(FloatToHalf(1.5f * min_subnormal), 0x0002);     // Tie 1|2: even.
  EXPECT_EQ(FloatToHalf(2.5f * min_subnormal), 0x0002);     // Tie 2|3: even.
  EXPECT_EQ(FloatToHalf(1023.5f * min_subnormal), 0x0400);  // Up into the normals.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(FloatToHalf(Bits(0x00000001u)), 0x0000);  // A float subnormal.
}

TEST(F16Test, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float value = HalfToFloat(bits);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(value)))) << std::hex << b;
    } else {
      EXPECT_EQ(FloatToHalf(value), bits) << std::hex << b;
    }
  }
}

TEST(F16Test, MatchesEnumerationReference) {
  const Grid grid = MakeGrid(HalfToFloat, 0x7bff, 0x7c00);
  for (size_t i = 0; i + 1 < grid.values.size(); ++i) {
    const float mid = static_cast<float>((grid.values[i] + grid.values[i + 1]) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)}) {
      ASSERT_EQ(FloatToHalf(x), ReferenceRound(grid, x)) << x;
      ASSERT_EQ(FloatToHalf(-x), ReferenceRound(grid, -x)) << -x;
    }
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-30.0f, 17.0f);
  for (int i = 0; i < 200000; ++i) {
    // Log-uniform magnitudes so that subnormal, normal and overflowing values are all common.
    const float x = std::exp2(exponent(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    ASSERT_EQ(FloatToHalf(x), ReferenceRound(grid, x)) << std::hex << Bits(x);
  }
}

TEST(ConvertTest, BulkMatchesScalar) {
  const std::vector<float> values = {0.0f, -1.5f, 1e-7f, 65504.0f, 1e6f, 3.14159265f};
  std::vector<uint16_t> halves(values.size());
  std::vector<uint16_t> bf16s(values.size());
  ConvertFromFloat(values.data(), DType::kF16, halves.data(), values.size());
  ConvertFromFloat(values.data(), DType::kBF16, bf16s.data(), values.size());
  std::vector<float> from_half(values.size());
  std::vector<float> from_bf16(values.size());
  ConvertToFloat(DType::kF16, halves.data(), from_half.data(), values.size());
  ConvertToFloat(DType::kBF16, bf16s.data(), from_bf16.data(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(halves[i], FloatToHalf(values[i])) << i;
    EXPECT_EQ(bf16s[i], FloatToBF16(values[i])) << i;
    EXPECT_EQ(Bits(from_half[i]), Bits(HalfToFloat(halves[i]))) << i;
    EXPECT_EQ(Bits(from_bf16[i]), Bits(BF16ToFloat(bf16s[i]))) << i;
  }
}

TEST(ConvertTest, TensorCastRoundsLikeScalars) {
  const Tensor t = Tensor::FromFloats({2}, {1.0f + std::ldexp(1.0f, -8), 70000.0f});
  const Tensor bf16 = t.CastTo(DType::kBF16);
  const Tensor f16 = t.CastTo(DType::kF16);
  ASSERT_EQ(bf16.num_bytes(), 4u);
  const auto* b = reinterpret_cast<const uint16_t*>(bf16.data());
  const auto* h = reinterpret_cast<const uint16_t*>(f16.data());
  EXPECT_EQ(b[0], 0x3f80);  // 1 + 2^-8 is a bf16 tie: even.
  EXPECT_EQ(h[1], 0x7c00);  // 70000 overflows half.
  EXPECT_EQ(f16.CastTo(DType::kF32).f32()[0], 1.0f + std::ldexp(1.0f, -8));  // Exact in half.
}

TEST(TensorTest, ConstructedFromBytesHoldsACopyOfThem) {
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x3555};
  const Tensor t(DType::kF16, {2, 3}, reinterpret_cast<const std::byte*>(halves.data()));
  ASSERT_EQ(t.num_bytes(), 12u);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(t.data(), halves.data(), 12), 0);
  EXPECT_NE(static_cast<const void*>(t.data()), static_cast<const void*>(halves.data()));
  const Tensor empty(DType::kF32, {0, 4}, nullptr);
  EXPECT_EQ(empty.num_bytes(), 0u);
}

// FirstNonFiniteElement tests whole blocks before it looks for the element: the first NaN or
// infinity is found at every offset around the block edges, in every dtype, with a later one
// present (the first must win) and with none.
TEST(FiniteCheckTest, FindsTheFirstNonFiniteElementAtEveryOffset) {
  constexpr int64_t kCount = 1100;  // Four blocks of 256 and a partial one.
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<float> values(kCount);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 100.0f);
    for (float& v : values) v = normal(rng);
    const Tensor finite = Tensor::FromFloats({kCount}, values).CastTo(dtype);
    EXPECT_EQ(FirstNonFiniteElement(finite), -1) << DTypeName(dtype);
    for (int64_t bad : {0, 1, 254, 255, 256, 257, 511, 512, 1023, 1024, 1098, 1099}) {
      for (float poison : {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf}) {
        std::vector<float> with_bad = values;
        with_bad[bad] = poison;
        if (bad + 300 < kCount) with_bad[bad + 300] = kInf;
        const Tensor t = Tensor::FromFloats({kCount}, with_bad).CastTo(dtype);
        EXPECT_EQ(FirstNonFiniteElement(t), bad) << DTypeName(dtype) << " poison " << poison;
      }
    }
  }
}

// MaxAbsValue of f32 compares bit patterns: the same value as a float maximum, negative values and
// infinity included, at sizes around its block.
TEST(FiniteCheckTest, MaxAbsValueMatchesAFloatMaximum) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-40.0f, 38.0f);
  for (int64_t count : {0, 1, 7, 1023, 1024, 1025, 5000}) {
    std::vector<float> values(static_cast<size_t>(count));
    for (float& v : values) {
      v = std::pow(10.0f, exponent(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    }
    float expected = 0.0f;
    for (float v : values) expected = std::max(expected, std::fabs(v));
    const Tensor t = Tensor::FromFloats({count}, values);
    EXPECT_EQ(Bits(MaxAbsValue(t)), Bits(expected)) << count;
    // The same values as bf16: the converting path.
    const Tensor b = t.CastTo(DType::kBF16);
    float expected_b = 0.0f;
    for (float v : b.ToFloats()) expected_b = std::max(expected_b, std::fabs(v));
    EXPECT_EQ(Bits(MaxAbsValue(b)), Bits(expected_b)) << count;
    if (count > 0) {
      // A NaN is skipped, as the converting path always did.
      std::vector<float> with_nan = values;
      with_nan[static_cast<size_t>(count) / 3] = std::numeric_limits<float>::quiet_NaN();
      float expected_nan = 0.0f;
      for (size_t i = 0; i < with_nan.size(); ++i) {
        if (i == static_cast<size_t>(count) / 3) continue;
        expected_nan = std::max(expected_nan, std::fabs(with_nan[i]));
      }
      EXPECT_EQ(Bits(MaxAbsValue(Tensor::FromFloats({count}, with_nan))), Bits(expected_nan))
          << count;
      values[static_cast<size_t>(count) / 2] = -kInf;
      EXPECT_EQ(MaxAbsValue(Tensor::FromFloats({count}, values)), kInf) << count;
    }
  }
}

}  // namespace
}  // namespace attnserve

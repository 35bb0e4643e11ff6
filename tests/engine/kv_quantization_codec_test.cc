// The 8-bit KV codes against independent float64 models of their formats: OCP FP8 E4M3FN (every
// one of the 256 codes, round to nearest even, saturation at 448, subnormals, NaN) and symmetric
// int8; the power-of-two scale rule; and one page's rows written with growing magnitudes, which
// must requantize the rows before them (kernels/cpu/host_page_store.h).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/gqa_layer.h"
#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/mla_layer.h"
#include "kernels/core/fp8_e4m3.h"
#include "kernels/kv/quantization.h"
#include "tests/reference/test_cases.h"

namespace attnserve {
namespace {

// The format from its definition, in float64: sign, 4-bit exponent (bias 7), 3-bit mantissa;
// exponent 0 is subnormal (m / 8 * 2^-6); S.1111.111 is NaN; nothing is infinite.
double E4M3Reference(int code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? mantissa / 8.0 * std::pow(2.0, -6)
                                         : (1.0 + mantissa / 8.0) * std::pow(2.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// The code nearest to x (float64 search over every finite code), ties to the even mantissa,
// magnitudes past 448 saturating.
int E4M3Nearest(double x) {
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double magnitude = std::min(std::fabs(x), 448.0);
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= 0x7e; ++code) {
    const double distance = std::fabs(E4M3Reference(code) - magnitude);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return sign | best;
}

TEST(Fp8E4M3Test, EveryCodeDecodesAsTheFormatSaysAndRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    SCOPED_TRACE(code);
    const double expected = E4M3Reference(code);
    const float decoded = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    // The computed decode (device code's, kernels/kv/kv_codes.h) is the table's.
    const float computed = Fp8E4M3Value(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(computed));
    } else {
      EXPECT_EQ(computed, decoded);
      EXPECT_EQ(std::signbit(computed), std::signbit(decoded));
    }
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(decoded));
      EXPECT_EQ(FloatToFp8E4M3(decoded) & 0x7f, 0x7f);  // NaN encodes as NaN.
      continue;
    }
    EXPECT_EQ(static_cast<double>(decoded), expected);
    EXPECT_EQ(FloatToFp8E4M3(decoded), code) << "a code must round-trip exactly (-0 included)";
  }
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // Smallest subnormal.
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));  // Smallest normal.
}

TEST(Fp8E4M3Test, RoundsToNearestEvenAndSaturates) {
  // Every midpoint between neighbouring codes goes to the one with the even mantissa.
  for (int code = 0; code < 0x7e; ++code) {
    const double midpoint = (E4M3Reference(code) + E4M3Reference(code + 1)) / 2;
    const int even = (code & 1) == 0 ? code : code + 1;
    EXPECT_EQ(FloatToFp8E4M3(static_cast<float>(midpoint)), even) << midpoint;
    EXPECT_EQ(FloatToFp8E4M3(static_cast<float>(-midpoint)), 0x80 | even) << -midpoint;
  }
  // Random magnitudes over the whole range against the float64 search.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> log2_magnitude(-12.0, 10.0);
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>((i % 2 ? -1 : 1) * std::exp2(log2_magnitude(rng)));
    ASSERT_EQ(FloatToFp8E4M3(x), E4M3Nearest(x)) << x;
  }
  // Saturation: no infinities in E4M3FN.
  for (float big :
       {448.0f, 449.0f, 463.9f, 464.0f, 480.0f, 1e30f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(FloatToFp8E4M3(big), 0x7e) << big;
    EXPECT_EQ(FloatToFp8E4M3(-big), 0xfe) << -big;
  }
  // Subnormals: 2^-10 is the midpoint of 0 and 2^-9 (ties to 0); 3 * 2^-10 goes to 2 * 2^-9.
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(FloatToFp8E4M3(3 * std::ldexp(1.0f, -10)), 0x02);
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -20)), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(15 * std::ldexp(1.0f, -10)), 0x08);  // 7.5 * 2^-9 -> 8 * 2^-9 = 2^-6.
}

TEST(Int8CodeTest, SymmetricRoundToNearestEvenWithANonFiniteMarker) {
  const KvQuantization q = KvQuantization::kInt8;
  for (int value = -127; value <= 127; ++value) {
    const uint8_t code = EncodeKvCode(q, static_cast<float>(value));
    EXPECT_EQ(static_cast<int8_t>(code), value);
    EXPECT_EQ(KvCodeValues(q)[code], static_cast<float>(value));
  }
  EXPECT_EQ(static_cast<int8_t>(EncodeKvCode(q, 2.5f)), 2);
  EXPECT_EQ(static_cast<int8_t>(EncodeKvCode(q, 3.5f)), 4);
  EXPECT_EQ(static_cast<int8_t>(EncodeKvCode(q, -2.5f)), -2);
  EXPECT_EQ(static_cast<int8_t>(EncodeKvCode(q, 2.51f)), 3);
  EXPECT_EQ(static_cast<int8_t>(EncodeKvCode(q, 500.0f)), 127);
  EXPECT_EQ(static_cast<int8_t>(EncodeKvCode(q, -500.0f)), -127);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(static_cast<int8_t>(EncodeKvCode(q, bad)), -128);
  }
  EXPECT_TRUE(std::isnan(KvCodeValues(q)[0x80]));
}

TEST(KvScaleTest, PowerOfTwoThatFitsTheAbsMax) {
  for (KvQuantization q : {KvQuantization::kFp8E4M3, KvQuantization::kInt8}) {
    EXPECT_EQ(KvScaleFor(q, 0.0f), 0.0f);
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> log2_absmax(-30.0, 30.0);
    for (int i = 0; i < 1000; ++i) {
      const float absmax = static_cast<float>(std::exp2(log2_absmax(rng)));
      const float scale = KvScaleFor(q, absmax);
      int exponent;
      ASSERT_EQ(std::frexp(scale, &exponent), 0.5f) << "a power of two";
      EXPECT_LE(absmax / scale, KvCodeMax(q));
      EXPECT_GT(absmax / scale, KvCodeMax(q) / 2) << "the smallest such power";
    }
    EXPECT_EQ(KvScaleFor(q, KvCodeMax(q)), 1.0f);
  }
}

TEST(KvScaleTest, Fp8RescaleByPowersOfTwoIsExactForNormalValues) {
  std::vector<uint8_t> codes;
  for (int code = 0x30; code <= 0x7e; ++code) codes.push_back(static_cast<uint8_t>(code));
  std::vector<uint8_t> rescaled = codes;
  RescaleKvCodes(KvQuantization::kFp8E4M3, rescaled.data(), static_cast<int64_t>(codes.size()),
                 0.25f, 1.0f);
  for (size_t i = 0; i < codes.size(); ++i) {
    EXPECT_EQ(Fp8E4M3ToFloat(rescaled[i]), Fp8E4M3ToFloat(codes[i]) * 0.25f);
  }
}

// One GQA page (2 KV heads, head_dim 8, 16 slots), rows written in slot order with magnitudes
// growing 1000-fold: each row must read back within one quantization step of the final scale
// (kernels/kv/quantization.h), which fails when earlier rows are not requantized (their codes,
// read at the grown scale, would be off by the growth factor).
TEST(KvPageRowsTest, GrowingRowsRequantizeTheRowsBeforeThem) {
  for (KvQuantization q : {KvQuantization::kFp8E4M3, KvQuantization::kInt8}) {
    SCOPED_TRACE(std::string(KvQuantizationName(q)));
    const LayerSpec spec = reference::StandardSpec(4, 2, 8, RopeLayout::kNone);
    KvCacheConfig config;
    config.storage = KvStorageFormat::Quantized(q);
    config.page_size = 16;
    const KvPageLayout layout = GqaLayer::MakePageLayout(spec, config);
    const int64_t page_bytes = KvPageBytes(spec, config.storage, 16);
    ASSERT_EQ(layout.scales_offset + 4 * layout.scale_count, page_bytes);
    ASSERT_EQ(page_bytes, 2 * 2 * 16 * 8 + 4 * 4);
    // A stale page (as a reused pool page would be): its scales must not leak into the new rows.
    std::vector<std::byte> page(page_bytes, std::byte{0x5a});
    std::mt19937_64 rng(5);
    std::normal_distribution<float> normal;
    std::vector<std::vector<float>> rows;  // [slot * 4 + head * 2 + value][8]
    for (int slot = 0; slot < 16; ++slot) {
      const float magnitude = std::pow(1000.0f, slot / 15.0f);
      for (int head = 0; head < 2; ++head) {
        for (bool value : {false, true}) {
          std::vector<float> row(8);
          for (float& x : row) x = magnitude * normal(rng);
          WritePageRow(layout, page.data(), head, value, slot, row.data(), 8);
          rows.push_back(row);
        }
      }
    }
    for (int head = 0; head < 2; ++head) {
      for (bool value : {false, true}) {
        float absmax = 0;
        for (int slot = 0; slot < 16; ++slot) {
          absmax = std::max(absmax, FiniteAbsMax(rows[slot * 4 + head * 2 + value].data(), 8));
        }
        const float scale = KvScaleFor(q, absmax);
        for (int slot = 0; slot < 16; ++slot) {
          std::vector<float> read(8);
          ReadPageRow(layout, page.data(), head, value, slot, 8, read.data());
          const std::vector<float>& row = rows[slot * 4 + head * 2 + value];
          for (int i = 0; i < 8; ++i) {
            // int8: one step is the scale; fp8: 2^-3 relative (the spacing at 448 is 32 * scale).
            const float bound = q == KvQuantization::kInt8
                                    ? scale
                                    : std::max(std::fabs(row[i]) / 8, 32 * scale / 448);
            EXPECT_LE(std::fabs(read[i] - row[i]), bound)
                << "head " << head << " value " << value << " slot " << slot << " x " << row[i];
          }
        }
      }
    }
  }
}

// MLA rows carry two scales, the latent's and the RoPE key's: a RoPE key 1000 times larger than
// the latent must not wipe out the latent's precision.
TEST(KvPageRowsTest, MlaLatentAndRopeKeyHaveTheirOwnScales) {
  const LayerSpec spec = reference::MlaSpec(0, 32, 16, 8, 16, RopeLayout::kHalf);
  KvCacheConfig config;
  config.storage = KvStorageFormat::Quantized(KvQuantization::kInt8);
  config.page_size = 4;
  const KvPageLayout layout = MlaLayer::MakePageLayout(spec, config);
  const int64_t page_bytes = KvPageBytes(spec, config.storage, 4);
  ASSERT_EQ(layout.scales_offset + 4 * layout.scale_count, page_bytes);
  ASSERT_EQ(page_bytes, 4 * 40 + 2 * 4);
  std::vector<std::byte> page(page_bytes);
  std::vector<float> row(40);
  for (int i = 0; i < 40; ++i) row[i] = i < 32 ? 0.01f * (i + 1) : 1000.0f * (i - 31);
  WritePageRow(layout, page.data(), 0, false, 0, row.data(), 40);
  std::vector<float> read(40);
  ReadPageRow(layout, page.data(), 0, false, 0, 40, read.data());
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(read[i], row[i], 0.32f / 127) << i;
  for (int i = 32; i < 40; ++i) EXPECT_NEAR(read[i], row[i], 8000.0f / 127) << i;
}

}  // namespace
}  // namespace attnserve

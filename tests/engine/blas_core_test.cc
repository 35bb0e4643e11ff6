// BetterBlasCore: which OpenBLAS choices the server replaces (only a pre-AVX2 fallback on a CPU
// with AVX2 and FMA) and by what (SkylakeX with AVX-512, else Haswell).
#include "kernels/cpu/blas_core.h"

#include <gtest/gtest.h>

namespace attnserve {
namespace {

constexpr CpuVectorFeatures kSse{false, false};
constexpr CpuVectorFeatures kAvx2{true, false};
constexpr CpuVectorFeatures kAvx512{true, true};

TEST(BetterBlasCoreTest, AFallbackOnAnAvx512CpuBecomesSkylakeX) {
  EXPECT_EQ(BetterBlasCore("Prescott", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("prescott", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Nehalem", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterBlasCore("Sandybridge", kAvx512), "SkylakeX");  // AVX, no AVX2 kernels.
}

TEST(BetterBlasCoreTest, AFallbackOnAnAvx2CpuBecomesHaswell) {
  EXPECT_EQ(BetterBlasCore("Prescott", kAvx2), "Haswell");
  EXPECT_EQ(BetterBlasCore("Core2", kAvx2), "Haswell");
}

TEST(BetterBlasCoreTest, ARecognisedCoreIsKept) {
  for (const char* core : {"Haswell", "haswell", "Zen", "SkylakeX", "skylakex", "Cooperlake",
                           "SapphireRapids", "Excavator"}) {
    EXPECT_EQ(BetterBlasCore(core, kAvx512), "") << core;
    EXPECT_EQ(BetterBlasCore(core, kAvx2), "") << core;
  }
}

TEST(BetterBlasCoreTest, ACpuWithoutAvx2KeepsWhatOpenBlasChose) {
  EXPECT_EQ(BetterBlasCore("Prescott", kSse), "");
  EXPECT_EQ(BetterBlasCore("Sandybridge", kSse), "");
}

TEST(BetterBlasCoreTest, DetectedFeaturesAreConsistent) {
  const CpuVectorFeatures f = DetectCpuVectorFeatures();
  if (f.avx512) EXPECT_TRUE(f.avx2_fma) << "AVX-512 F/BW/VL/DQ without AVX2 and FMA";
}

}  // namespace
}  // namespace attnserve

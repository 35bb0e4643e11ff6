// Configure with weights.convert_from (MHA -> GQA by mean-pooling K/V heads) against the real
// server: the parameter budget counts the MHA weights the conversion holds while it pools them, so
// a conversion that would pass --max_parameter_bytes is refused before anything is allocated,
// while the same GQA layer from a seed fits.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using ::testing::HasSubstr;

class ConvertFromBudgetTest : public ServerTest {
 protected:
  // The GQA layer below holds 20,480 fp32 parameters (81,920 bytes), 163,840 at its Configure
  // peak; its MHA source adds 131,072 bytes (294,912 in all). The limit sits between the two.
  std::vector<std::string> ExtraFlags() const override { return {"--max_parameter_bytes=230000"}; }

  static LayerSpec Gqa() {
    LayerSpec spec;
    spec.variant = AttentionVariant::kGQA;
    spec.d_model = 64;
    spec.num_heads = 8;
    spec.num_kv_heads = 2;
    spec.head_dim = 16;
    spec.rope = RopeLayout::kHalf;
    return spec;
  }
};

TEST_F(ConvertFromBudgetTest, ConversionIsChargedForTheMhaWeightsItPools) {
  v1::ConfigureRequest converted = SeedConfigure(Gqa(), 3);
  converted.mutable_weights()->mutable_convert_from()->set_seed(3);
  v1::ConfigureResponse response;
  grpc::Status status = Configure(stub(), converted, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("max_parameter_bytes"));

  status = Configure(stub(), SeedConfigure(Gqa(), 3), &response);
  EXPECT_TRUE(status.ok()) << Describe(status) << " (the seeded layer alone fits)";
}

}  // namespace
}  // namespace attnserve::server_test

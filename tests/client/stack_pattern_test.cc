// attnctl's --stack pattern (client/attnctl/stack_pattern.h): runs and kinds expand in order over
// the base spec, and every malformed entry is refused naming --stack and the entry.
#include "client/attnctl/stack_pattern.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/stack/layer_stack.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

LayerSpec Base() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.sliding_window = 77;  // The base's own window is replaced by each entry's.
  return spec;
}

TEST(StackPatternTest, ExpandsRunsInOrder) {
  absl::StatusOr<std::vector<LayerSpec>> layers = ExpandStackPattern(Base(), "sw:4096x5,global");
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ((*layers)[i].sliding_window, 4096);
  EXPECT_EQ((*layers)[5].sliding_window, 0);
  EXPECT_EQ((*layers)[5].d_model, 64);
  layers = ExpandStackPattern(Base(), "global,sw:8,globalx2");
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->size(), 4u);
  EXPECT_EQ(LayerKind((*layers)[1]), "sliding_window:8");
  EXPECT_EQ(LayerKind((*layers)[3]), "global");
}

TEST(StackPatternTest, RefusesMalformedEntriesByName) {
  for (const char* pattern :
       {"", "sw:", "sw:0", "sw:-3", "local", "globalx0", "globalxx", "sw:8,"}) {
    absl::StatusOr<std::vector<LayerSpec>> layers = ExpandStackPattern(Base(), pattern);
    EXPECT_EQ(layers.status().code(), absl::StatusCode::kInvalidArgument) << pattern;
    EXPECT_THAT(layers.status().message(), HasSubstr("--stack")) << pattern;
  }
  EXPECT_THAT(ExpandStackPattern(Base(), "globalx129").status().message(),
              HasSubstr("more than 128 layers"));
}

}  // namespace
}  // namespace attnserve

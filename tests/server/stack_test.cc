// Hybrid stacks against the real server (ConfigureRequest.stack): a 6-layer stack of 5
// sliding-window layers and 1 global one computes bit for bit what the same LayerStack computes
// in-process (seed weights: layer i from seed + i), GetSession reports its KV by layer kind (the
// window layers' held pages stop at their window, the global layer's grow with the context), and
// every malformed stack is refused by name.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/stack/layer_stack.h"
#include "tests/support/model_session_util.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using ::testing::HasSubstr;

constexpr int kWindow = 32;

// 5 sliding-window : 1 global, as Gemma 3; GQA 4:2, head dim 16, d_model 64.
std::vector<LayerSpec> FiveToOne() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.rope = RopeLayout::kHalf;
  std::vector<LayerSpec> specs(6, spec);
  for (int i = 0; i < 5; ++i) {
    specs[i].sliding_window = kWindow;
    specs[i].rope_theta = 10000.0;
  }
  specs[5].rope_theta = 1000000.0;
  return specs;
}

class StackTest : public ServerTest {};

TEST_F(StackTest, FiveToOneStackMatchesTheInProcessStackAndReportsKvByKind) {
  const std::vector<LayerSpec> specs = FiveToOne();
  constexpr uint64_t kSeed = 42;
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), StackConfigureRequest(specs, kSeed), &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  ASSERT_EQ(configured.stack_size(), 6);
  EXPECT_EQ(configured.stack(0).sliding_window(), kWindow);
  EXPECT_EQ(configured.stack(5).sliding_window(), 0);
  const std::string session = configured.session_id();
  const int64_t page_bytes = configured.cost().page_bytes();
  ASSERT_GT(page_bytes, 0);
  // 2 KV heads x 16 dims x K and V x f32, six layers.
  EXPECT_EQ(configured.cost().kv_bytes_per_token(), 6 * 2 * 16 * 2 * 4);

  // The same stack in-process: the same backend threads, layer i drawn from seed + i.
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend =
      CreateCpuBackend({.num_threads = kBackendThreads});
  ASSERT_TRUE(backend.ok());
  std::vector<LayerWeights> weights;
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::StatusOr<LayerWeights> w = RandomLayerWeights(specs[i], kSeed + i);
    ASSERT_TRUE(w.ok()) << w.status();
    weights.push_back(*std::move(w));
  }
  KvCacheConfig config;
  config.storage = DType::kF32;
  config.page_size = 16;
  config.max_pages = 1 << 12;
  absl::StatusOr<std::unique_ptr<LayerStack>> reference =
      LayerStack::Create(**backend, specs, weights, config);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const SequenceId sequence = (*reference)->CreateSequence();

  std::mt19937_64 rng(3);
  constexpr int64_t kPrompt = 100;
  const Tensor prompt = RandomHidden(kPrompt, 64, rng);
  v1::ForwardRequest forward;
  forward.set_session_id(session);
  *forward.add_items() = MakeForwardItem("r", prompt);
  v1::ForwardResponse forwarded;
  status = Forward(stub(), forward, &forwarded);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const PrefillChunk chunk{sequence, kPrompt};
  absl::StatusOr<Tensor> expected = (*reference)->Prefill({&chunk, 1}, prompt, {});
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(SameBytes(forwarded.results(0).output(), *expected));

  constexpr int kSteps = 10;
  for (int step = 0; step < kSteps; ++step) {
    const Tensor hidden = RandomHidden(1, 64, rng);
    v1::DecodeRequest decode;
    decode.set_session_id(session);
    *decode.add_items() = MakeDecodeItem("r", hidden);
    v1::DecodeResponse decoded;
    status = Decode(stub(), decode, &decoded);
    ASSERT_TRUE(status.ok()) << Describe(status);
    absl::StatusOr<Tensor> want = (*reference)->Decode({&sequence, 1}, hidden, {});
    ASSERT_TRUE(want.ok());
    EXPECT_TRUE(SameBytes(decoded.results(0).output(), *want)) << "step " << step;
  }

  // 110 tokens: the global layer holds ceil(110 / 16) = 7 pages; each window layer of 32 tokens
  // holds the 3 pages its next query can still see.
  const int64_t length = kPrompt + kSteps;
  const int64_t global_pages = PagesForTokens(length, 16);
  const int64_t window_pages = global_pages - (length - kWindow + 1) / 16;
  ASSERT_EQ(window_pages, 3);
  const v1::SessionInfo info = SessionInfoOf(stub(), session);
  EXPECT_EQ(info.num_layers(), 6);
  ASSERT_EQ(info.kv_by_layer_kind_size(), 2);
  EXPECT_EQ(info.kv_by_layer_kind(0).kind(), absl::StrCat("sliding_window:", kWindow));
  EXPECT_EQ(info.kv_by_layer_kind(0).layers(), 5);
  EXPECT_EQ(info.kv_by_layer_kind(0).kv_bytes(), 5 * window_pages * page_bytes);
  EXPECT_EQ(info.kv_by_layer_kind(1).kind(), "global");
  EXPECT_EQ(info.kv_by_layer_kind(1).layers(), 1);
  EXPECT_EQ(info.kv_by_layer_kind(1).kv_bytes(), global_pages * page_bytes);
  EXPECT_EQ(info.kv_bytes_used(), (5 * window_pages + global_pages) * page_bytes);

  ASSERT_TRUE(Release(stub(), session, "r").ok());
  const v1::SessionInfo released = SessionInfoOf(stub(), session);
  EXPECT_EQ(released.kv_bytes_used(), 0);
  EXPECT_EQ(released.kv_by_layer_kind(0).kv_bytes(), 0);
  EXPECT_EQ(released.kv_by_layer_kind(1).kv_bytes(), 0);
}

TEST_F(StackTest, OneLayerSessionsReportOneLayer) {
  v1::ConfigureResponse configured;
  ASSERT_TRUE(Configure(stub(), SeedConfigure(FiveToOne()[5], 1), &configured).ok());
  EXPECT_EQ(configured.stack_size(), 0);
  const v1::SessionInfo info = SessionInfoOf(stub(), configured.session_id());
  EXPECT_EQ(info.num_layers(), 1);
  EXPECT_EQ(info.kv_by_layer_kind_size(), 0);
}

TEST_F(StackTest, MalformedStacksAreRefusedByName) {
  const auto expect = [&](const v1::ConfigureRequest& request, const std::string& needle) {
    v1::ConfigureResponse response;
    grpc::Status status = Configure(stub(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
    EXPECT_THAT(status.error_message(), HasSubstr(needle));
  };
  const std::vector<LayerSpec> specs = FiveToOne();
  v1::ConfigureRequest both = StackConfigureRequest(specs, 1);
  *both.mutable_spec() = LayerSpecToProto(specs[0]);
  expect(both, "spec and stack");
  std::vector<LayerSpec> wide = specs;
  wide[2].d_model = 128;
  expect(StackConfigureRequest(wide, 1), "stack.layers[2].d_model = 128");
  std::vector<LayerSpec> bad = specs;
  bad[4].num_heads = 3;  // Not a multiple of num_kv_heads.
  expect(StackConfigureRequest(bad, 1), "stack.layers[4]");
  v1::ConfigureRequest inline_weights = StackConfigureRequest(specs, 1);
  inline_weights.mutable_weights()->mutable_inline_weights();
  expect(inline_weights, "weights.inline_weights");
  v1::ConfigureRequest too_deep = StackConfigureRequest({}, 1);
  too_deep.mutable_stack()->set_num_layers(kMaxStackLayers + 1);
  expect(too_deep, "stack.num_layers");
  v1::ConfigureRequest empty = StackConfigureRequest({}, 1);
  empty.mutable_stack();
  expect(empty, "stack: needs stack.layers");
  v1::ConfigureRequest disagree = StackConfigureRequest(specs, 1);
  disagree.mutable_stack()->set_num_layers(4);
  expect(disagree, "stack.num_layers = 4");
}

// The parameter budget counts every layer: 6 layers of 12288 fp32 parameters hold 294912 bytes
// and need twice that while being built, so a budget of 400000 bytes refuses the stack by name.
class StackParameterBudgetTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--max_parameter_bytes=400000"}; }
};

TEST_F(StackParameterBudgetTest, TheStackIsChargedAsTheSumOfItsLayers) {
  v1::ConfigureResponse configured;
  ASSERT_TRUE(Configure(stub(), SeedConfigure(FiveToOne()[0], 1), &configured).ok());
  EXPECT_EQ(configured.cost().parameter_count(), 12288);
  grpc::Status status = Configure(stub(), StackConfigureRequest(FiveToOne(), 1), &configured);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("this stack (73728 parameters"));
}

}  // namespace
}  // namespace attnserve::server_test

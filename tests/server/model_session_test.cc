// Model sessions (StackSpec.per_layer) against the real server: one session holds every layer,
// each call names one layer and returns that layer's attention output (checked bit for bit
// against one in-process layer per index, layer i drawn from seed + i); a request's position
// advances once per step; calls out of order are refused by name with nothing changed; a step's
// KV pages for every layer are charged at layer 0; Release frees every layer; Fork copies them.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/model_session_util.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 3;
constexpr uint64_t kSeed = 7;
constexpr int64_t kDModel = 64;

// SmallBiasedGqa three times: a sliding-window layer of 32 tokens, then two global ones.
std::vector<LayerSpec> ThreeLayers() {
  std::vector<LayerSpec> specs(kLayers, SmallBiasedGqa());
  specs[0].sliding_window = 32;
  return specs;
}

class ModelSessionTest : public ServerTest {
 protected:
  std::string ConfigureModel(const std::vector<LayerSpec>& specs) {
    v1::ConfigureResponse configured;
    const grpc::Status status = Configure(stub(), ModelConfigureRequest(specs, kSeed), &configured);
    EXPECT_TRUE(status.ok()) << Describe(status);
    return configured.session_id();
  }
};

TEST_F(ModelSessionTest, EachLayerComputesItsOwnLayerAndPositionsAdvanceOncePerStep) {
  const std::vector<LayerSpec> specs = ThreeLayers();
  const std::string session = ConfigureModel(specs);
  ASSERT_FALSE(session.empty());
  std::vector<std::unique_ptr<ReferenceSession>> reference;
  for (int k = 0; k < kLayers; ++k) {
    absl::StatusOr<std::unique_ptr<ReferenceSession>> layer =
        ReferenceSession::Create(specs[k], kSeed + k);
    ASSERT_TRUE(layer.ok()) << layer.status();
    reference.push_back(*std::move(layer));
  }
  const v1::SessionInfo info = SessionInfoOf(stub(), session);
  EXPECT_TRUE(info.per_layer());
  EXPECT_EQ(info.num_layers(), kLayers);
  ASSERT_EQ(info.kv_by_layer_kind_size(), 2);
  EXPECT_EQ(info.kv_by_layer_kind(0).kind(), "sliding_window:32");
  EXPECT_EQ(info.kv_by_layer_kind(1).layers(), 2);

  std::mt19937_64 rng(11);
  constexpr int64_t kPrompt = 40;
  for (int k = 0; k < kLayers; ++k) {
    const Tensor hidden = RandomHidden(kPrompt, kDModel, rng);
    v1::ForwardResponse response;
    const grpc::Status status = ForwardLayer(stub(), session, k, "r", hidden, &response);
    ASSERT_TRUE(status.ok()) << "layer " << k << ": " << Describe(status);
    absl::StatusOr<std::vector<Tensor>> expected = reference[k]->Forward({{"r", hidden, {}}});
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_TRUE(SameBytes(response.results(0).output(), (*expected)[0])) << "layer " << k;
    EXPECT_EQ(response.results(0).sequence_length(), kPrompt);
    EXPECT_EQ(RequestState(stub(), session, "r"), std::make_pair(kPrompt, (k + 1) % kLayers));
  }
  for (int step = 0; step < 3; ++step) {
    for (int k = 0; k < kLayers; ++k) {
      const Tensor hidden = RandomHidden(1, kDModel, rng);
      v1::DecodeResponse response;
      const grpc::Status status = DecodeLayer(stub(), session, k, "r", hidden, &response);
      ASSERT_TRUE(status.ok()) << "step " << step << " layer " << k << ": " << Describe(status);
      absl::StatusOr<std::vector<Tensor>> expected = reference[k]->Decode({{"r", hidden, {}}});
      ASSERT_TRUE(expected.ok()) << expected.status();
      EXPECT_TRUE(SameBytes(response.results(0).output(), (*expected)[0]))
          << "step " << step << " layer " << k;
      EXPECT_EQ(response.results(0).sequence_length(), kPrompt + step + 1);
    }
  }
  EXPECT_EQ(RequestState(stub(), session, "r"), std::make_pair(kPrompt + 3, 0));
}

TEST_F(ModelSessionTest, CallsOutOfOrderAreRefusedByNameWithNothingChanged) {
  const std::string session = ConfigureModel(ThreeLayers());
  std::mt19937_64 rng(5);
  const Tensor prompt = RandomHidden(8, kDModel, rng);
  const Tensor token = RandomHidden(1, kDModel, rng);
  v1::ForwardResponse forwarded;
  v1::DecodeResponse decoded;
  // Layer 1 of a request that does not exist, and of one with no step in flight.
  grpc::Status status = ForwardLayer(stub(), session, 1, "r", prompt, &forwarded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("layer 1 of request 'r'"));
  ASSERT_TRUE(ForwardLayer(stub(), session, 0, "r", prompt, &forwarded).ok());
  ASSERT_TRUE(ForwardLayer(stub(), session, 1, "r", prompt, &forwarded).ok());
  ASSERT_TRUE(ForwardLayer(stub(), session, 2, "r", prompt, &forwarded).ok());
  status = DecodeLayer(stub(), session, 1, "r", token, &decoded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("no step is in flight"));

  // Mid-step (layer 0 ran): layer 2 before layer 1, a new step, other token counts.
  ASSERT_TRUE(DecodeLayer(stub(), session, 0, "r", token, &decoded).ok());
  const std::pair<int64_t, int> mid_step = RequestState(stub(), session, "r");
  EXPECT_EQ(mid_step, std::make_pair(int64_t{9}, 1));
  const int64_t used = SessionInfoOf(stub(), session).kv_bytes_used();
  status = DecodeLayer(stub(), session, 2, "r", token, &decoded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("layer 2 of request 'r' out of order"));
  EXPECT_THAT(status.error_message(), HasSubstr("runs layer 1 next"));
  status = DecodeLayer(stub(), session, 0, "r", token, &decoded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("layer 0 of request 'r' starts a new step"));
  status = ForwardLayer(stub(), session, 1, "r", RandomHidden(2, kDModel, rng), &forwarded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("2 tokens, but its step"));
  // Out of range, and a layer index on a session that is not a model session.
  status = DecodeLayer(stub(), session, kLayers, "r", token, &decoded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("layer = 3: out of range"));
  status = DecodeLayer(stub(), session, -1, "r", token, &decoded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  v1::ConfigureResponse plain;
  ASSERT_TRUE(Configure(stub(), SeedConfigure(SmallBiasedGqa(), 1), &plain).ok());
  status = DecodeLayer(stub(), plain.session_id(), 1, "r", token, &decoded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("not a model session"));

  // Nothing changed: the step goes on at layer 1.
  EXPECT_EQ(RequestState(stub(), session, "r"), mid_step);
  EXPECT_EQ(SessionInfoOf(stub(), session).kv_bytes_used(), used);
  ASSERT_TRUE(DecodeLayer(stub(), session, 1, "r", token, &decoded).ok());
  ASSERT_TRUE(DecodeLayer(stub(), session, 2, "r", token, &decoded).ok());
  EXPECT_EQ(RequestState(stub(), session, "r"), std::make_pair(int64_t{9}, 0));
}

// A pool of 20 pages of 16 tokens x 2 KV heads x 16 dims x K and V in f32 (4 KiB a page).
constexpr int64_t kPageBytes = 16 * 2 * 16 * 2 * 4;
constexpr int64_t kPoolPages = 20;

class ModelSessionBudgetTest : public ModelSessionTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--kv_pool_bytes=", kPoolPages * kPageBytes)};
  }
};

TEST_F(ModelSessionBudgetTest, LayerZeroChargesEveryLayerAndReleaseFreesThemAll) {
  const std::string session = ConfigureModel(std::vector<LayerSpec>(kLayers, SmallBiasedGqa()));
  absl::StatusOr<v1::GetServerInfoResponse> before = ServerInfo(stub());
  ASSERT_TRUE(before.ok()) << before.status();
  std::mt19937_64 rng(9);
  // 64 tokens: 4 pages per layer, all 3 layers' 12 pages charged by the layer-0 call.
  const Tensor prompt = RandomHidden(64, kDModel, rng);
  v1::ForwardResponse forwarded;
  ASSERT_TRUE(ForwardLayer(stub(), session, 0, "a", prompt, &forwarded).ok());
  absl::StatusOr<v1::GetServerInfoResponse> charged = ServerInfo(stub());
  ASSERT_TRUE(charged.ok());
  EXPECT_EQ(charged->kv_pool_used_bytes() - before->kv_pool_used_bytes(), kLayers * 4 * kPageBytes);
  // Another such step needs 12 pages; 8 are free (though one layer's 4 pages would fit).
  grpc::Status status = ForwardLayer(stub(), session, 0, "b", prompt, &forwarded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
  EXPECT_EQ(RequestState(stub(), session, "b").first, -1);
  absl::StatusOr<v1::GetServerInfoResponse> after = ServerInfo(stub());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->kv_pool_used_bytes(), charged->kv_pool_used_bytes());
  // The step's later layers take no more from the pool.
  ASSERT_TRUE(ForwardLayer(stub(), session, 1, "a", prompt, &forwarded).ok());
  ASSERT_TRUE(ForwardLayer(stub(), session, 2, "a", prompt, &forwarded).ok());
  after = ServerInfo(stub());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->kv_pool_used_bytes(), charged->kv_pool_used_bytes());
  EXPECT_EQ(SessionInfoOf(stub(), session).kv_bytes_used(), kLayers * 4 * kPageBytes);

  // A decode step (65 tokens: a 5th page per layer), then a step released mid-way: layer 0 of
  // 16 more tokens (81: a 6th page per layer, charged for all three now, allocated by layer 0
  // only). Release gives back every layer's pages and the reservation of layers 1 and 2.
  v1::DecodeResponse decoded;
  for (int k = 0; k < kLayers; ++k) {
    ASSERT_TRUE(DecodeLayer(stub(), session, k, "a", RandomHidden(1, kDModel, rng), &decoded).ok());
  }
  ASSERT_TRUE(
      ForwardLayer(stub(), session, 0, "a", RandomHidden(16, kDModel, rng), &forwarded).ok());
  after = ServerInfo(stub());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->kv_pool_used_bytes() - before->kv_pool_used_bytes(), kLayers * 6 * kPageBytes);
  EXPECT_EQ(SessionInfoOf(stub(), session).kv_bytes_used(), (6 + 5 + 5) * kPageBytes);
  v1::ReleaseResponse released;
  ASSERT_TRUE(Release(stub(), session, "a", &released).ok());
  after = ServerInfo(stub());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->kv_pool_used_bytes(), before->kv_pool_used_bytes());
  EXPECT_EQ(SessionInfoOf(stub(), session).kv_bytes_used(), 0);
  // Now the step that did not fit does.
  EXPECT_TRUE(ForwardLayer(stub(), session, 0, "b", prompt, &forwarded).ok());
}

TEST_F(ModelSessionTest, ForkCopiesEveryLayerAndIsRefusedInMidStep) {
  const std::string session = ConfigureModel(ThreeLayers());
  std::mt19937_64 rng(13);
  v1::ForwardResponse forwarded;
  const Tensor prompt = RandomHidden(20, kDModel, rng);
  ASSERT_TRUE(ForwardLayer(stub(), session, 0, "r", prompt, &forwarded).ok());
  v1::ForkRequest fork;
  fork.set_session_id(session);
  fork.set_request_id("r");
  fork.add_new_request_ids("f");
  v1::ForkResponse forked;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub().Fork(&context, fork, &forked);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
    EXPECT_THAT(status.error_message(), HasSubstr("request 'r' is in mid-step"));
  }
  ASSERT_TRUE(ForwardLayer(stub(), session, 1, "r", prompt, &forwarded).ok());
  ASSERT_TRUE(ForwardLayer(stub(), session, 2, "r", prompt, &forwarded).ok());
  {
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub().Fork(&context, fork, &forked);
    ASSERT_TRUE(status.ok()) << Describe(status);
  }
  EXPECT_EQ(RequestState(stub(), session, "f"), std::make_pair(int64_t{20}, 0));
  // The fork and its source, given the same tokens, answer the same at every layer.
  for (int k = 0; k < kLayers; ++k) {
    const Tensor hidden = RandomHidden(1, kDModel, rng);
    v1::DecodeRequest decode;
    decode.set_session_id(session);
    decode.set_layer(k);
    *decode.add_items() = MakeDecodeItem("r", hidden);
    *decode.add_items() = MakeDecodeItem("f", hidden);
    v1::DecodeResponse decoded;
    const grpc::Status status = Decode(stub(), decode, &decoded);
    ASSERT_TRUE(status.ok()) << "layer " << k << ": " << Describe(status);
    EXPECT_EQ(decoded.results(0).output().data(), decoded.results(1).output().data())
        << "layer " << k;
  }
  EXPECT_EQ(RequestState(stub(), session, "f"), std::make_pair(int64_t{21}, 0));
}

TEST_F(ModelSessionTest, APerLayerStackNeedsLayersOrACheckpoint) {
  // A per-layer stack with neither layers nor num_layers needs a checkpoint's config.json.
  v1::ConfigureRequest request;
  request.mutable_stack()->set_per_layer(true);
  request.mutable_weights()->set_seed(1);
  v1::ConfigureResponse configured;
  const grpc::Status status = Configure(stub(), request, &configured);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("stack: needs stack.layers"));
}

}  // namespace
}  // namespace attnserve::server_test

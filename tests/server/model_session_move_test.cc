// Moving a model session's request (StackSpec.per_layer) between two real server processes: one
// ExportRequest carries every layer's pages (a sliding-window layer's evicted pages left out) and
// one ImportRequest recreates them in a model session of the same fingerprint, charged once.
// The moved request decodes bit for bit as its unmoved twin at every layer; a request mid-step
// is refused by name; refused imports (another stack, a one-layer session, a layer that refuses
// its pages after earlier layers took theirs, too few bytes, a taken id, the KV budget) change
// neither side. A hybrid stack's request moves the same way.
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/model_session_util.h"
#include "tests/support/second_server.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 3;
constexpr uint64_t kSeed = 7;
constexpr int64_t kDModel = 64;
// SmallBiasedGqa's KV page: 16 tokens x 2 KV heads x 16 dims x K and V in f32.
constexpr int64_t kPageBytes = 16 * 2 * 16 * 2 * 4;
// 70 tokens: 5 pages in each global layer; the window-32 layer evicted its leading ones.
constexpr int64_t kPrompt = 70;

// SmallBiasedGqa `layers` times, the first with a sliding window of 32 tokens.
v1::ConfigureRequest ModelConfigure(int layers) {
  std::vector<LayerSpec> specs(static_cast<size_t>(layers), SmallBiasedGqa());
  if (layers > 0) specs[0].sliding_window = 32;
  return ModelConfigureRequest(specs, kSeed);
}

std::string ConfigureModel(v1::AttentionService::Stub& stub, int layers = kLayers,
                           std::string* fingerprint = nullptr) {
  v1::ConfigureResponse configured;
  const grpc::Status status = Configure(stub, ModelConfigure(layers), &configured);
  EXPECT_TRUE(status.ok()) << Describe(status);
  if (fingerprint != nullptr) *fingerprint = configured.fingerprint();
  return configured.session_id();
}

// Runs one whole step (layers 0..n-1) of `rows` random tokens on `request_id`: a Forward for
// more than one row, else a Decode.
void Step(v1::AttentionService::Stub& stub, const std::string& session,
          const std::string& request_id, int64_t rows, std::mt19937_64& rng) {
  for (int k = 0; k < kLayers; ++k) {
    const Tensor hidden = RandomHidden(rows, kDModel, rng);
    grpc::Status status;
    if (rows > 1) {
      v1::ForwardResponse response;
      status = ForwardLayer(stub, session, k, request_id, hidden, &response);
    } else {
      v1::DecodeResponse response;
      status = DecodeLayer(stub, session, k, request_id, hidden, &response);
    }
    ASSERT_TRUE(status.ok()) << "layer " << k << ": " << Describe(status);
  }
}

class ModelSessionMoveTest : public ServerTest {};

TEST_F(ModelSessionMoveTest, MovedRequestDecodesBitForBitAsItsUnmovedTwinAtEveryLayer) {
  SecondServer b;
  ASSERT_TRUE(b.ok());
  std::string fingerprint_a, fingerprint_b;
  const std::string sa = ConfigureModel(stub(), kLayers, &fingerprint_a);
  const std::string sb = ConfigureModel(b.stub(), kLayers, &fingerprint_b);
  ASSERT_EQ(fingerprint_a, fingerprint_b) << "the same stack and seed on two replicas";

  // On A, "moved" and "twin" take the same prompt and 3 decode steps (one call each per layer:
  // equal call shapes compute equal bits).
  std::mt19937_64 rng(11);
  for (int step = 0; step < 4; ++step) {
    const int64_t rows = step == 0 ? kPrompt : 1;
    for (int k = 0; k < kLayers; ++k) {
      const Tensor hidden = RandomHidden(rows, kDModel, rng);
      for (const char* id : {"moved", "twin"}) {
        grpc::Status status;
        if (rows > 1) {
          v1::ForwardResponse response;
          status = ForwardLayer(stub(), sa, k, id, hidden, &response);
        } else {
          v1::DecodeResponse response;
          status = DecodeLayer(stub(), sa, k, id, hidden, &response);
        }
        ASSERT_TRUE(status.ok()) << id << " layer " << k << ": " << Describe(status);
      }
    }
  }
  const int64_t length = kPrompt + 3;

  // One export, released from A, holds every layer: the window layer's leading pages evicted.
  Exported exported;
  const grpc::Status exported_status =
      Export(stub(), sa, "moved", /*release=*/true, &exported, /*max_chunk_bytes=*/5000);
  ASSERT_TRUE(exported_status.ok()) << Describe(exported_status);
  const v1::ExportedRequest& header = exported.header;
  EXPECT_EQ(header.sequence_length(), length);
  EXPECT_EQ(header.page_bytes(), kPageBytes);
  EXPECT_EQ(header.first_held_page(), 0);
  ASSERT_EQ(header.layers_size(), kLayers);
  const int64_t pages = (length + 15) / 16;
  int64_t held = 0;
  for (int k = 0; k < kLayers; ++k) {
    const v1::ExportedLayer& layer = header.layers(k);
    EXPECT_EQ(layer.sequence_length(), length) << "layer " << k;
    EXPECT_EQ(layer.first_held_page() + layer.held_pages(), pages) << "layer " << k;
    held += layer.held_pages();
  }
  EXPECT_GT(header.layers(0).first_held_page(), 0) << "the window of 32 evicted pages";
  EXPECT_EQ(header.layers(1).first_held_page(), 0);
  EXPECT_EQ(header.held_pages(), held);
  EXPECT_EQ(static_cast<int64_t>(exported.pages.size()), held * kPageBytes);
  EXPECT_GT(exported.chunks, 1) << "chunks of at most 5000 bytes";
  EXPECT_EQ(RequestState(stub(), sa, "moved").first, -1) << "released by the export";

  // Imported into B, charged once for all layers.
  const int64_t b_before = PoolUsed(b.stub());
  v1::ImportRequestResponse imported;
  const grpc::Status imported_status =
      Import(b.stub(), sb, "moved", header, exported.pages, &imported);
  ASSERT_TRUE(imported_status.ok()) << Describe(imported_status);
  EXPECT_EQ(imported.sequence_length(), length);
  EXPECT_EQ(imported.kv_bytes_added(), held * kPageBytes);
  EXPECT_EQ(PoolUsed(b.stub()), b_before + held * kPageBytes);
  EXPECT_EQ(RequestState(b.stub(), sb, "moved"), std::make_pair(length, 0));

  // 8 more steps (decodes, then a 5-token prefill chunk): B's "moved" answers A's "twin" bit for
  // bit at every layer.
  for (int step = 0; step < 9; ++step) {
    const int64_t rows = step == 8 ? 5 : 1;
    for (int k = 0; k < kLayers; ++k) {
      const Tensor hidden = RandomHidden(rows, kDModel, rng);
      std::string outputs[2];
      int64_t lengths[2] = {0, 0};
      int i = 0;
      for (auto [server, session, id] :
           {std::make_tuple(&b.stub(), sb, "moved"), std::make_tuple(&stub(), sa, "twin")}) {
        grpc::Status status;
        if (rows > 1) {
          v1::ForwardResponse response;
          status = ForwardLayer(*server, session, k, id, hidden, &response);
          if (status.ok()) {
            outputs[i] = response.results(0).output().data();
            lengths[i] = response.results(0).sequence_length();
          }
        } else {
          v1::DecodeResponse response;
          status = DecodeLayer(*server, session, k, id, hidden, &response);
          if (status.ok()) {
            outputs[i] = response.results(0).output().data();
            lengths[i] = response.results(0).sequence_length();
          }
        }
        ASSERT_TRUE(status.ok()) << id << " step " << step << " layer " << k << ": "
                                 << Describe(status);
        ++i;
      }
      EXPECT_EQ(outputs[0], outputs[1]) << "step " << step << " layer " << k;
      EXPECT_FALSE(outputs[0].empty());
      EXPECT_EQ(lengths[0], lengths[1]);
    }
  }
  EXPECT_EQ(RequestState(b.stub(), sb, "moved"), std::make_pair(length + 13, 0));
}

TEST_F(ModelSessionMoveTest, ExportMidStepIsRefusedNamingTheLayerWithNothingChanged) {
  const std::string session = ConfigureModel(stub());
  std::mt19937_64 rng(5);
  Step(stub(), session, "r", 20, rng);
  v1::DecodeResponse decoded;
  ASSERT_TRUE(DecodeLayer(stub(), session, 0, "r", RandomHidden(1, kDModel, rng), &decoded).ok());
  const std::pair<int64_t, int> mid_step = RequestState(stub(), session, "r");
  ASSERT_EQ(mid_step, std::make_pair(int64_t{21}, 1));
  const int64_t pool = PoolUsed(stub());
  const int64_t used = SessionInfoOf(stub(), session).kv_bytes_used();

  for (const bool release : {true, false}) {
    Exported refused;
    const grpc::Status status = Export(stub(), session, "r", release, &refused);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
    EXPECT_THAT(status.error_message(), HasSubstr("request 'r'"));
    EXPECT_THAT(status.error_message(), HasSubstr("is mid-step"));
    EXPECT_THAT(status.error_message(), HasSubstr("runs layer 1 next"));
    EXPECT_TRUE(refused.pages.empty());
    // Nothing changed, a releasing export included.
    EXPECT_EQ(RequestState(stub(), session, "r"), mid_step);
    EXPECT_EQ(PoolUsed(stub()), pool);
    EXPECT_EQ(SessionInfoOf(stub(), session).kv_bytes_used(), used);
  }

  // The step goes on at layer 1; once layer 2 ran, the request moves.
  ASSERT_TRUE(DecodeLayer(stub(), session, 1, "r", RandomHidden(1, kDModel, rng), &decoded).ok());
  ASSERT_TRUE(DecodeLayer(stub(), session, 2, "r", RandomHidden(1, kDModel, rng), &decoded).ok());
  Exported exported;
  const grpc::Status status = Export(stub(), session, "r", /*release=*/false, &exported);
  ASSERT_TRUE(status.ok()) << Describe(status);
  ASSERT_EQ(exported.header.layers_size(), kLayers);
  for (int k = 0; k < kLayers; ++k) EXPECT_EQ(exported.header.layers(k).sequence_length(), 21);
}

TEST_F(ModelSessionMoveTest, RefusedImportsLeaveBothSidesUnchanged) {
  const std::string sa = ConfigureModel(stub());
  std::mt19937_64 rng(17);
  Step(stub(), sa, "r", kPrompt, rng);
  const int64_t a_pool = PoolUsed(stub());
  Exported exported;
  grpc::Status status = Export(stub(), sa, "r", /*release=*/false, &exported);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const v1::ExportedRequest& header = exported.header;
  ASSERT_EQ(header.layers_size(), kLayers);

  SecondServer b;
  ASSERT_TRUE(b.ok());
  const std::string sb = ConfigureModel(b.stub());
  const std::string two_layers = ConfigureModel(b.stub(), 2);
  v1::ConfigureResponse one_layer;
  ASSERT_TRUE(Configure(b.stub(), SeedConfigure(SmallBiasedGqa(), kSeed), &one_layer).ok());
  const int64_t b_pool = PoolUsed(b.stub());
  const auto b_unchanged = [&](const std::string& what) {
    EXPECT_EQ(PoolUsed(b.stub()), b_pool) << what;
    EXPECT_EQ(RequestState(b.stub(), sb, "r").first, -1) << what;
    EXPECT_EQ(SessionInfoOf(b.stub(), sb).kv_bytes_used(), 0) << what;
  };
  v1::ImportRequestResponse imported;

  // Another stack, and a session of one layer: their fingerprints differ.
  status = Import(b.stub(), two_layers, "r", header, exported.pages, &imported);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("fingerprint"));
  status = Import(b.stub(), one_layer.session_id(), "r", header, exported.pages, &imported);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  b_unchanged("other sessions");

  // A header without its layers, into the model session.
  v1::ExportedRequest flat = header;
  flat.clear_layers();
  status = Import(b.stub(), sb, "r", flat, exported.pages, &imported);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("holds a stack of 3 layers"));
  b_unchanged("no layers");

  // Layer 2 (global) said to have evicted its first page: the header adds up, layers 0 and 1
  // import their pages, layer 2 refuses; the import is undone whole.
  v1::ExportedRequest lying = header;
  lying.mutable_layers(2)->set_first_held_page(1);
  lying.mutable_layers(2)->set_held_pages(header.layers(2).held_pages() - 1);
  lying.set_held_pages(header.held_pages() - 1);
  const size_t layer2_offset = static_cast<size_t>(
      (header.layers(0).held_pages() + header.layers(1).held_pages()) * kPageBytes);
  std::string fewer = exported.pages;
  fewer.erase(layer2_offset, static_cast<size_t>(kPageBytes));
  status = Import(b.stub(), sb, "r", lying, fewer, &imported);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("layers[2]"));
  EXPECT_THAT(status.error_message(), HasSubstr("first_held_page"));
  b_unchanged("layer 2 refused");

  // Counts that do not add up, and a byte short.
  v1::ExportedRequest miscounted = header;
  miscounted.mutable_layers(1)->set_held_pages(header.layers(1).held_pages() - 1);
  status = Import(b.stub(), sb, "r", miscounted, exported.pages, &imported);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("header.request.layers[1]"));
  status = Import(b.stub(), sb, "r", header, exported.pages.substr(1), &imported);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  b_unchanged("miscounted");

  // The true export imports; a second import under the same id is ALREADY_EXISTS.
  status = Import(b.stub(), sb, "r", header, exported.pages, &imported);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const int64_t b_after = PoolUsed(b.stub());
  EXPECT_EQ(b_after, b_pool + header.held_pages() * kPageBytes);
  status = Import(b.stub(), sb, "r", header, exported.pages, &imported);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << Describe(status);
  EXPECT_EQ(PoolUsed(b.stub()), b_after);

  // The source is as it was (the export did not release it) and goes on.
  EXPECT_EQ(RequestState(stub(), sa, "r"), std::make_pair(kPrompt, 0));
  EXPECT_EQ(PoolUsed(stub()), a_pool);
  Step(stub(), sa, "r", 1, rng);
  EXPECT_EQ(RequestState(stub(), sa, "r"), std::make_pair(kPrompt + 1, 0));
}

TEST_F(ModelSessionMoveTest, ImportPastTheKvBudgetIsResourceExhaustedWithNothingChanged) {
  const std::string sa = ConfigureModel(stub());
  std::mt19937_64 rng(23);
  Step(stub(), sa, "r", kPrompt, rng);
  Exported exported;
  grpc::Status status = Export(stub(), sa, "r", /*release=*/false, &exported);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const int64_t held = exported.header.held_pages();
  ASSERT_GT(held, 3);

  // B's pool holds the request's pages of every layer once, and 2 pages more.
  SecondServer b({absl::StrCat("--kv_pool_bytes=", (held + 2) * kPageBytes)});
  ASSERT_TRUE(b.ok());
  const std::string sb = ConfigureModel(b.stub());
  v1::ImportRequestResponse imported;
  status = Import(b.stub(), sb, "r", exported.header, exported.pages, &imported);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const int64_t full = PoolUsed(b.stub());
  EXPECT_EQ(full, held * kPageBytes) << "every layer's pages charged once";

  status = Import(b.stub(), sb, "r2", exported.header, exported.pages, &imported);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
  EXPECT_EQ(PoolUsed(b.stub()), full);
  EXPECT_EQ(RequestState(b.stub(), sb, "r2").first, -1);
  EXPECT_EQ(RequestState(b.stub(), sb, "r"), std::make_pair(kPrompt, 0));
  EXPECT_EQ(SessionInfoOf(b.stub(), sb).kv_bytes_used(), held * kPageBytes);

  // Nothing leaked: with "r" released, "r2" fits.
  v1::ReleaseResponse released;
  ASSERT_TRUE(Release(b.stub(), sb, "r", &released).ok());
  EXPECT_EQ(PoolUsed(b.stub()), 0);
  status = Import(b.stub(), sb, "r2", exported.header, exported.pages, &imported);
  EXPECT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(PoolUsed(b.stub()), held * kPageBytes);
}

// A hybrid stack (residual mode, all layers per call) moves the same way: one export of every
// layer, decoding on as its twin.
TEST_F(ModelSessionMoveTest, AHybridStackRequestMovesToo) {
  SecondServer b;
  ASSERT_TRUE(b.ok());
  v1::ConfigureRequest hybrid = ModelConfigure(kLayers);
  hybrid.mutable_stack()->set_per_layer(false);
  v1::ConfigureResponse on_a, on_b;
  ASSERT_TRUE(Configure(stub(), hybrid, &on_a).ok());
  ASSERT_TRUE(Configure(b.stub(), hybrid, &on_b).ok());
  std::mt19937_64 rng(31);
  const Tensor prompt = RandomHidden(kPrompt, kDModel, rng);
  for (const char* id : {"moved", "twin"}) {
    v1::ForwardRequest forward;
    forward.set_session_id(on_a.session_id());
    *forward.add_items() = MakeForwardItem(id, prompt);
    v1::ForwardResponse forwarded;
    ASSERT_TRUE(Forward(stub(), forward, &forwarded).ok()) << id;
  }
  Exported exported;
  grpc::Status status = Export(stub(), on_a.session_id(), "moved", /*release=*/true, &exported);
  ASSERT_TRUE(status.ok()) << Describe(status);
  ASSERT_EQ(exported.header.layers_size(), kLayers);
  EXPECT_GT(exported.header.layers(0).first_held_page(), 0);
  v1::ImportRequestResponse imported;
  status = Import(b.stub(), on_b.session_id(), "moved", exported.header, exported.pages, &imported);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(imported.kv_bytes_added(), exported.header.held_pages() * kPageBytes);
  for (int step = 0; step < 4; ++step) {
    const Tensor hidden = RandomHidden(1, kDModel, rng);
    std::string outputs[2];
    int i = 0;
    for (auto [server, session, id] : {std::make_tuple(&b.stub(), on_b.session_id(), "moved"),
                                       std::make_tuple(&stub(), on_a.session_id(), "twin")}) {
      v1::DecodeRequest decode;
      decode.set_session_id(session);
      *decode.add_items() = MakeDecodeItem(id, hidden);
      v1::DecodeResponse decoded;
      status = Decode(*server, decode, &decoded);
      ASSERT_TRUE(status.ok()) << id << " step " << step << ": " << Describe(status);
      outputs[i++] = decoded.results(0).output().data();
    }
    EXPECT_FALSE(outputs[0].empty());
    EXPECT_EQ(outputs[0], outputs[1]) << "step " << step;
  }
}

}  // namespace
}  // namespace attnserve::server_test

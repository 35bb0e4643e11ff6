// A hybrid stack from a real checkpoint against transformers: the server, configured with
// stack.num_layers = 6 from a tiny random Gemma 3 model of 5 sliding-window : 1 global layers
// (tests/peer/make_stack_peer_case.py; each layer's spec read from config.json: window, RoPE
// base, linear scaling of the global layer, q/k norm), returns for x what transformers' own
// attention modules return chained on the residual stream, h <- h + self_attn_i(h) with each
// layer's own mask and rotary embeddings: in one Forward, and as a prefill followed by decode
// steps. GetSession reports the KV of 5 window layers and 1 global layer.
//
// Bound: 1e-4 relative L2 on the attention part h_N - x (x itself passes through exactly, so
// measuring h_N would dilute the error). fp32 on both sides; each layer alone reaches ~1e-6
// (tests/engine/peer_test.cc), and six layers add, and feed each other, that error.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/model/safetensors.h"
#include "proto/codec/tensor_codec.h"
#include "tests/reference/peer_case.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

namespace fs = std::filesystem;

constexpr double kMaxRelativeError = 1e-4;
constexpr char kCase[] = "gemma3_five_to_one_stack";

fs::path StackCasesDir() {
  return reference::PeerCasesRoot("ATTNSERVE_PEER_STACK_CASES", ATTNSERVE_PEER_STACK_CASES_DIR);
}

// Relative L2 error of (actual - x) against (expected - x).
double AttentionPartError(const std::vector<float>& actual, const std::vector<float>& expected,
                          const std::vector<float>& x) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double want = static_cast<double>(expected[i]) - x[i];
    const double got = static_cast<double>(actual[i]) - x[i];
    error += (got - want) * (got - want);
    norm += want * want;
  }
  return std::sqrt(error / norm);
}

class StackPeerTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--checkpoint_root=", StackCasesDir().string())};
  }
};

TEST_F(StackPeerTest, GemmaFiveToOneStackMatchesTransformers) {
  const fs::path dir = StackCasesDir() / kCase;
  ASSERT_TRUE(fs::exists(dir / "config.json")) << dir << ": run make_stack_peer_case.py";
  absl::StatusOr<reference::PeerIo> io = reference::ReadPeerIo(dir);
  ASSERT_TRUE(io.ok()) << io.status();
  const Tensor* hidden = &io->hidden;
  const std::vector<int64_t>& position_ids = io->positions;
  const int64_t length = hidden->dim(0);
  const int64_t d_model = hidden->dim(1);
  const std::vector<float> x = hidden->ToFloats();
  const std::vector<float> wanted = io->expected.ToFloats();

  v1::ConfigureRequest configure;
  configure.mutable_weights()->mutable_checkpoint()->set_path(kCase);
  configure.mutable_stack()->set_num_layers(6);
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), configure, &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  ASSERT_EQ(configured.stack_size(), 6);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(configured.stack(i).sliding_window(), 8) << i;
  EXPECT_EQ(configured.stack(5).sliding_window(), 0);
  EXPECT_NE(configured.stack(0).rope_theta(), configured.stack(5).rope_theta());
  const std::string session = configured.session_id();

  // One Forward of all tokens.
  v1::ForwardRequest forward;
  forward.set_session_id(session);
  *forward.add_items() = MakeForwardItem("one_shot", *hidden, position_ids);
  v1::ForwardResponse forwarded;
  status = Forward(stub(), forward, &forwarded);
  ASSERT_TRUE(status.ok()) << Describe(status);
  absl::StatusOr<Tensor> output = TensorFromProto(forwarded.results(0).output());
  ASSERT_TRUE(output.ok()) << output.status();
  const double one_shot = AttentionPartError(output->ToFloats(), wanted, x);
  EXPECT_LE(one_shot, kMaxRelativeError);

  // Half prefilled, the rest decoded one token at a time (the window layers evict meanwhile).
  const int64_t split = length / 2;
  forward.clear_items();
  *forward.add_items() =
      MakeForwardItem("split", SliceRows(*hidden, 0, split),
                      absl::MakeConstSpan(position_ids).subspan(0, static_cast<size_t>(split)));
  status = Forward(stub(), forward, &forwarded);
  ASSERT_TRUE(status.ok()) << Describe(status);
  std::vector<Tensor> parts;
  absl::StatusOr<Tensor> head = TensorFromProto(forwarded.results(0).output());
  ASSERT_TRUE(head.ok());
  parts.push_back(*std::move(head));
  for (int64_t t = split; t < length; ++t) {
    v1::DecodeRequest decode;
    decode.set_session_id(session);
    *decode.add_items() = MakeDecodeItem("split", SliceRows(*hidden, t, t + 1), position_ids[t]);
    v1::DecodeResponse decoded;
    status = Decode(stub(), decode, &decoded);
    ASSERT_TRUE(status.ok()) << Describe(status);
    absl::StatusOr<Tensor> row = TensorFromProto(decoded.results(0).output());
    ASSERT_TRUE(row.ok());
    parts.push_back(*std::move(row));
  }
  const double split_error = AttentionPartError(ConcatRows(parts).ToFloats(), wanted, x);
  EXPECT_LE(split_error, kMaxRelativeError);
  std::cout << "stack of 6 (5 sliding : 1 global) vs transformers, L=" << length
            << " d_model=" << d_model << ": relative error of h_N - x " << one_shot
            << " (one Forward), " << split_error << " (prefill " << split << " + decode)\n";

  v1::GetSessionRequest get;
  get.set_session_id(session);
  v1::GetSessionResponse info;
  grpc::ClientContext context;
  SetDeadline(context);
  ASSERT_TRUE(stub().GetSession(&context, get, &info).ok());
  EXPECT_EQ(info.session().num_layers(), 6);
  ASSERT_EQ(info.session().kv_by_layer_kind_size(), 2);
  EXPECT_EQ(info.session().kv_by_layer_kind(0).kind(), "sliding_window:8");
  EXPECT_EQ(info.session().kv_by_layer_kind(0).layers(), 5);
  EXPECT_EQ(info.session().kv_by_layer_kind(1).kind(), "global");
  // Two requests of 29 tokens in pages of 16: the global layer holds both pages of each; a window
  // layer only the second (the next query sees tokens 21..29), 1 page per request.
  const int64_t page_bytes = configured.cost().page_bytes();
  EXPECT_EQ(info.session().kv_by_layer_kind(1).kv_bytes(), 2 * 2 * page_bytes);
  EXPECT_EQ(info.session().kv_by_layer_kind(0).kv_bytes(), 5 * 2 * 1 * page_bytes);
}

// Explicit layers with a checkpoint must each agree with config.json's layer; a stack deeper than
// the model is refused naming the layer.
TEST_F(StackPeerTest, CheckpointStacksAreCheckedAgainstConfigJson) {
  ASSERT_TRUE(fs::exists(StackCasesDir() / kCase / "config.json"));
  v1::ConfigureRequest from_config;
  from_config.mutable_weights()->mutable_checkpoint()->set_path(kCase);
  from_config.mutable_stack()->set_num_layers(6);
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), from_config, &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);

  v1::ConfigureRequest stated;
  *stated.mutable_weights() = from_config.weights();
  *stated.mutable_stack()->mutable_layers() = configured.stack();  // As config.json says: OK.
  v1::ConfigureResponse response;
  status = Configure(stub(), stated, &response);
  EXPECT_TRUE(status.ok()) << Describe(status);
  stated.mutable_stack()->mutable_layers(5)->set_sliding_window(8);  // Layer 5 is global.
  status = Configure(stub(), stated, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(),
              ::testing::HasSubstr("stack.layers[5]: spec contradicts the checkpoint's "
                                   "config.json for layer 5"));

  v1::ConfigureRequest too_deep = from_config;
  too_deep.mutable_stack()->set_num_layers(7);
  status = Configure(stub(), too_deep, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("stack.layers[6]: "));
}

}  // namespace
}  // namespace attnserve::server_test

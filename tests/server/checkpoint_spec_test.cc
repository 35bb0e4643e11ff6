// Configure with the spec taken from a checkpoint's config.json (server/session/checkpoint_spec.h),
// end to end: the server's --checkpoint_root is the peer cases' directory
// (tests/peer/make_peer_cases.py, tiny random transformers models saved with save_pretrained), each
// case is configured from its directory alone - no spec in the request - and its recorded
// transformers output must come back from Forward. Also: a stated spec that contradicts
// config.json, a config.json with a key we do not implement, and a request with neither.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/model/hf_config.h"
#include "kernels/spec/layer_spec_json.h"
#include "kernels/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"
#include "tests/reference/peer_case.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The peer test's bound for fp32 against transformers (tests/engine/peer_test.cc).
constexpr double kMaxRelativeError = 1e-4;

fs::path PeerCasesDir() {
  return reference::PeerCasesRoot("ATTNSERVE_PEER_CASES", ATTNSERVE_PEER_CASES_DIR);
}

// Cases with a config.json (the transformers ones; the torch.nn.MultiheadAttention cases have
// none).
std::vector<std::string> ConfigCases() {
  std::vector<std::string> names;
  for (const fs::path& dir :
       reference::PeerCaseDirs(PeerCasesDir(), {"config.json", "io.safetensors"})) {
    names.push_back(dir.filename().string());
  }
  return names;
}

// case.json's layer_index (the test fails when it cannot be read).
int LayerIndex(const fs::path& dir) {
  absl::StatusOr<reference::PeerCaseInfo> info = reference::ReadCaseInfo(dir);
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? info->layer_index : -1;
}

class CheckpointSpecTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--checkpoint_root=", PeerCasesDir().string())};
  }

  static v1::ConfigureRequest FromCheckpoint(const std::string& path, int layer_index) {
    v1::ConfigureRequest request;
    request.mutable_weights()->mutable_checkpoint()->set_path(path);
    request.mutable_weights()->mutable_checkpoint()->set_layer_index(layer_index);
    return request;
  }
};

TEST_F(CheckpointSpecTest, EveryCaseConfiguresFromConfigJsonAlone) {
  const std::vector<std::string> cases = ConfigCases();
  ASSERT_GE(cases.size(), 10u) << "peer cases missing under " << PeerCasesDir();
  for (const std::string& name : cases) {
    SCOPED_TRACE(name);
    const fs::path dir = PeerCasesDir() / name;
    const int layer_index = LayerIndex(dir);

    v1::ConfigureResponse configured;
    grpc::Status status = Configure(stub(), FromCheckpoint(name, layer_index), &configured);
    ASSERT_TRUE(status.ok()) << Describe(status);
    absl::StatusOr<LayerSpec> spec = LayerSpecFromProto(configured.spec());
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<LayerSpec> recorded = reference::ReadRecordedSpec(dir);
    ASSERT_TRUE(recorded.ok()) << recorded.status();
    EXPECT_EQ(LayerSpecDifference(*spec, *recorded), "");

    absl::StatusOr<reference::PeerIo> io = reference::ReadPeerIo(dir);
    ASSERT_TRUE(io.ok()) << io.status();

    v1::ForwardRequest forward;
    forward.set_session_id(configured.session_id());
    *forward.add_items() = MakeForwardItem("r", io->hidden, io->positions);
    v1::ForwardResponse response;
    status = Forward(stub(), forward, &response);
    ASSERT_TRUE(status.ok()) << Describe(status);
    absl::StatusOr<Tensor> output = TensorFromProto(response.results(0).output());
    ASSERT_TRUE(output.ok()) << output.status();
    const std::vector<float> actual = output->ToFloats();
    const std::vector<float> wanted = io->expected.ToFloats();
    ASSERT_EQ(actual.size(), wanted.size());
    double error = 0, norm = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
      error += (static_cast<double>(actual[i]) - wanted[i]) * (actual[i] - wanted[i]);
      norm += static_cast<double>(wanted[i]) * wanted[i];
    }
    EXPECT_LE(std::sqrt(error / norm), kMaxRelativeError);
    ASSERT_TRUE(Release(stub(), configured.session_id(), "").ok());
  }
}

TEST_F(CheckpointSpecTest, StatedSpecMustAgreeWithConfigJson) {
  const fs::path dir = PeerCasesDir() / "mistral_swa";
  ASSERT_TRUE(fs::exists(dir / "config.json"));
  const int layer_index = LayerIndex(dir);
  absl::StatusOr<LayerSpec> recorded = reference::ReadRecordedSpec(dir);
  ASSERT_TRUE(recorded.ok()) << recorded.status();

  v1::ConfigureRequest agreeing = FromCheckpoint("mistral_swa", layer_index);
  *agreeing.mutable_spec() = LayerSpecToProto(*recorded);
  v1::ConfigureResponse response;
  grpc::Status status = Configure(stub(), agreeing, &response);
  EXPECT_TRUE(status.ok()) << Describe(status);

  LayerSpec contradicting = *recorded;
  contradicting.sliding_window = 0;  // The checkpoint's model slides; this spec would not.
  v1::ConfigureRequest request = FromCheckpoint("mistral_swa", layer_index);
  *request.mutable_spec() = LayerSpecToProto(contradicting);
  status = Configure(stub(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("sliding_window"));
  EXPECT_THAT(status.error_message(), HasSubstr("config.json"));
}

TEST_F(CheckpointSpecTest, NoSpecAndNoConfigJsonIsRefused) {
  v1::ConfigureRequest seeded;
  seeded.mutable_weights()->set_seed(1);
  v1::ConfigureResponse response;
  grpc::Status status = Configure(stub(), seeded, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("spec: required"));

  // A bare .safetensors file inside a case directory has config.json beside it: that one counts.
  status = Configure(stub(), FromCheckpoint("llama_gqa/model.safetensors", 0), &response);
  EXPECT_TRUE(status.ok()) << Describe(status);
}

// A root of its own holding a copy of one case whose config.json gains a key we do not implement.
class UnknownConfigKeyTest : public ServerTest {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / absl::StrCat("attnserve_hfcfg_", getpid());
    fs::create_directories(root_ / "model");
    const fs::path source = PeerCasesDir() / "llama_gqa";
    fs::copy_file(source / "model.safetensors", root_ / "model" / "model.safetensors");
    absl::StatusOr<std::string> text = reference::ReadText(source / "config.json");
    ASSERT_TRUE(text.ok()) << text.status();
    nlohmann::json config = nlohmann::json::parse(*text);
    config["use_qk_norm"] = true;  // Llama 4's switch; our llama mapping does not know it.
    std::ofstream(root_ / "model" / "config.json") << config.dump();
    ServerTest::SetUp();
  }
  void TearDown() override {
    ServerTest::TearDown();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--checkpoint_root=", root_.string())};
  }
  fs::path root_;
};

TEST_F(UnknownConfigKeyTest, RefusedByName) {
  v1::ConfigureRequest request;
  request.mutable_weights()->mutable_checkpoint()->set_path("model");
  v1::ConfigureResponse response;
  grpc::Status status = Configure(stub(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("use_qk_norm"));
}

}  // namespace
}  // namespace attnserve::server_test

// Checkpoint paths against the real attnserve_server (issue 14): a FIFO, a device, a file that is
// not a checkpoint, symlinks out of --checkpoint_root, and non-finite weights. Every Configure must
// answer promptly with a status that reveals neither file contents nor which paths exist outside
// the root, and the server must keep serving.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/model/checkpoint_loader.h"
#include "kernels/model/layer_weights.h"
#include "kernels/model/safetensors.h"
#include "proto/codec/spec_codec.h"
#include "tests/reference/test_cases.h"
#include "tests/support/server_fixture.h"

namespace attnserve::server_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

LayerSpec TestSpec() { return reference::FindSpec("gqa2_half_window7").spec; }

// The one answer for a checkpoint path that cannot be used (server/session/weight_source.h).
std::string Unusable(const std::string& path) {
  return absl::StrCat("weights.checkpoint.path: '", path,
                      "' is not a readable checkpoint under the server's checkpoint root");
}

// A scratch directory with root/ (the server's --checkpoint_root) and outside/ next to it.
class ScratchDirs {
 public:
  ScratchDirs() {
    std::string dir = (fs::temp_directory_path() / "attnserve_checkpoint_test.XXXXXX").string();
    if (mkdtemp(dir.data()) != nullptr) base_ = dir;
    if (!base_.empty()) {
      fs::create_directories(root());
      fs::create_directories(outside());
    }
  }
  ~ScratchDirs() {
    std::error_code ignored;
    if (!base_.empty()) fs::remove_all(base_, ignored);
  }
  std::string root() const { return base_ + "/root"; }
  std::string outside() const { return base_ + "/outside"; }

 private:
  std::string base_;
};

class CheckpointHardeningTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--checkpoint_root=", dirs_.root())};
  }

  // Configure with `path` as checkpoint (layer 0) within a 10 s deadline: a server blocked on
  // the path answers DEADLINE_EXCEEDED, which the callers' status checks catch (no bound in
  // milliseconds, which a loaded machine could break).
  grpc::Status ConfigureCheckpoint(const std::string& path) {
    v1::ConfigureRequest request = SeedConfigure(TestSpec(), 0);
    request.mutable_weights()->mutable_checkpoint()->set_path(path);
    request.mutable_weights()->mutable_checkpoint()->set_layer_index(0);
    grpc::ClientContext context;
    SetDeadline(context, std::chrono::seconds(10));
    v1::ConfigureResponse response;
    return stub().Configure(&context, request, &response);
  }

  // A valid checkpoint of TestSpec() at `path`, optionally with one NaN.
  void WriteCheckpoint(const std::string& path, bool with_nan = false) {
    absl::StatusOr<LayerWeights> weights = RandomLayerWeights(TestSpec(), 7);
    ASSERT_TRUE(weights.ok()) << weights.status();
    std::map<std::string, Tensor> tensors;
    for (auto& [name, tensor] : *weights) tensors.emplace(HfAttentionPrefix(0) + name, tensor);
    if (with_nan) {
      tensors.at(HfAttentionPrefix(0) + "v_proj.weight").f32()[3] =
          std::numeric_limits<float>::quiet_NaN();
    }
    ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  }

  // The server still configures sessions (from a seed and from a checkpoint in the root).
  void ExpectServing() {
    v1::ConfigureResponse response;
    const grpc::Status seeded = Configure(stub(), SeedConfigure(TestSpec(), 1), &response);
    EXPECT_TRUE(seeded.ok()) << Describe(seeded);
    const std::string good = dirs_.root() + "/good.safetensors";
    if (!fs::exists(good)) WriteCheckpoint(good);
    const grpc::Status loaded = ConfigureCheckpoint(good);
    EXPECT_TRUE(loaded.ok()) << Describe(loaded);
  }

  ScratchDirs dirs_;
};

TEST_F(CheckpointHardeningTest, FifoIsRefusedPromptlyAndTheServerKeepsServing) {
  const std::string fifo = dirs_.root() + "/model.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  const std::string dir_with_fifo = dirs_.root() + "/fifo_checkpoint";
  fs::create_directories(dir_with_fifo);
  ASSERT_EQ(mkfifo((dir_with_fifo + "/model.safetensors").c_str(), 0644), 0);
  fs::create_symlink("/dev/zero", dirs_.root() + "/zero.safetensors");

  // More calls than the server has compute threads (2): blocked threads would stall the rest.
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    grpc::Status status = ConfigureCheckpoint(fifo);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
    EXPECT_EQ(status.error_message(), Unusable(fifo));

    status = ConfigureCheckpoint(dir_with_fifo);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
    EXPECT_THAT(status.error_message(), HasSubstr("a FIFO"));

    const std::string zero = dirs_.root() + "/zero.safetensors";
    status = ConfigureCheckpoint(zero);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
    EXPECT_EQ(status.error_message(), Unusable(zero));
  }
  ExpectServing();
}

TEST_F(CheckpointHardeningTest, OneAnswerForMissingUnreadableAndOutsideTheRoot) {
  // A real checkpoint outside the root, and ways to reach it or nothing at all.
  const std::string outside_file = dirs_.outside() + "/model.safetensors";
  WriteCheckpoint(outside_file);
  fs::create_symlink(outside_file, dirs_.root() + "/link_out.safetensors");
  fs::create_symlink(dirs_.outside(), dirs_.root() + "/dir_link_out");
  fs::create_symlink(dirs_.root() + "/nothing", dirs_.root() + "/dangling.safetensors");
  const std::string fifo = dirs_.root() + "/fifo.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);

  const std::vector<std::string> paths = {
      dirs_.root() + "/missing.safetensors",     // Missing inside the root.
      dirs_.outside() + "/missing.safetensors",  // Missing outside.
      outside_file,                              // Exists, readable, outside.
      dirs_.root() + "/link_out.safetensors",    // Symlink out of the root.
      dirs_.root() + "/dir_link_out",            // Directory symlink out of the root.
      dirs_.root() + "/dangling.safetensors",    // Dangling symlink (unreadable, even for root).
      fifo,                                      // Not a regular file.
      "../outside/model.safetensors",            // Relative, climbing out.
      "/etc/shadow",
      "/proc/self/environ",
  };
  for (const std::string& path : paths) {
    const grpc::Status status = ConfigureCheckpoint(path);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << path << ": " << Describe(status);
    EXPECT_EQ(status.error_message(), Unusable(path));
  }
  ExpectServing();
}

TEST_F(CheckpointHardeningTest, InsideTheRootThroughSymlinksAndRelativePaths) {
  WriteCheckpoint(dirs_.root() + "/real.safetensors");
  fs::create_directories(dirs_.root() + "/snapshots");
  fs::create_symlink(dirs_.root() + "/real.safetensors",
                     dirs_.root() + "/snapshots/model.safetensors");
  for (const std::string& path :
       {dirs_.root() + "/real.safetensors", dirs_.root() + "/snapshots",
        dirs_.root() + "/snapshots/model.safetensors", std::string("real.safetensors"),
        std::string("snapshots/../real.safetensors")}) {
    const grpc::Status status = ConfigureCheckpoint(path);
    EXPECT_TRUE(status.ok()) << path << ": " << Describe(status);
  }
}

TEST_F(CheckpointHardeningTest, ErrorsQuoteNoBytesOfTheFile) {
  // The shape of /etc/shadow: its first 8 bytes, read as a header length, spell "root:*:1".
  const std::string shadow = dirs_.root() + "/shadow";
  std::ofstream(shadow) << "root:*:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n";
  uint64_t as_length = 0;
  std::memcpy(&as_length, "root:*:1", 8);
  const grpc::Status status = ConfigureCheckpoint(shadow);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("not a safetensors file"));
  EXPECT_THAT(status.error_message(), Not(HasSubstr("root:")));
  EXPECT_THAT(status.error_message(), Not(HasSubstr("19000")));
  EXPECT_THAT(status.error_message(), Not(HasSubstr(absl::StrCat(as_length))));
  ExpectServing();
}

TEST_F(CheckpointHardeningTest, LongPathsAreClipped) {
  const std::string path = dirs_.root() + "/" + std::string(5000, 'p');
  const grpc::Status status = ConfigureCheckpoint(path);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat("...(", path.size(), " bytes)")));
  EXPECT_LT(status.error_message().size(), 400u);
}

TEST_F(CheckpointHardeningTest, NonFiniteWeightsAreRefused) {
  // From a checkpoint.
  const std::string with_nan = dirs_.root() + "/nan.safetensors";
  WriteCheckpoint(with_nan, /*with_nan=*/true);
  grpc::Status status = ConfigureCheckpoint(with_nan);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("weight 'v_proj.weight' has a NaN or infinite"));
  EXPECT_THAT(status.error_message(), HasSubstr("element 3"));

  // Inline.
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(TestSpec(), 3);
  ASSERT_TRUE(weights.ok());
  weights->at("q_proj.weight").f32()[5] = std::numeric_limits<float>::quiet_NaN();
  weights->at("o_proj.weight").f32()[0] = std::numeric_limits<float>::infinity();
  v1::ConfigureRequest request = SeedConfigure(TestSpec(), 0);
  for (const auto& [name, tensor] : *weights) {
    v1::NamedTensor* named = request.mutable_weights()->mutable_inline_weights()->add_tensors();
    named->set_name(name);
    TensorToProto(tensor, named->mutable_tensor());
  }
  v1::ConfigureResponse response;
  status = Configure(stub(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("NaN or infinite"));
  EXPECT_THAT(status.error_message(),
              ::testing::AnyOf(HasSubstr("'q_proj.weight'"), HasSubstr("'o_proj.weight'")));
  ExpectServing();
}

// A path that cannot be used is answered as such whether or not a spec is sent: it used to be
// "spec: required (only a checkpoint directory with a config.json can supply it)" without one.
TEST_F(CheckpointHardeningTest, AnUnusablePathIsAnsweredBeforeTheMissingSpec) {
  WriteCheckpoint(dirs_.root() + "/model.safetensors");
  for (const std::string& path : {dirs_.root() + "/modle.safetensors", std::string("/etc"),
                                  std::string("../port"), dirs_.outside()}) {
    for (const bool with_spec : {false, true}) {
      v1::ConfigureRequest request;
      if (with_spec) *request.mutable_spec() = LayerSpecToProto(TestSpec());
      request.mutable_weights()->mutable_checkpoint()->set_path(path);
      v1::ConfigureResponse response;
      const grpc::Status status = Configure(stub(), request, &response);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
          << path << (with_spec ? " with" : " without") << " a spec: " << Describe(status);
      EXPECT_EQ(status.error_message(), Unusable(path));
    }
  }
  // The same for the MHA checkpoint of a conversion.
  v1::ConfigureRequest conversion;
  conversion.mutable_weights()->mutable_convert_from()->mutable_checkpoint()->set_path("/etc");
  v1::ConfigureResponse response;
  grpc::Status status = Configure(stub(), conversion, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
  EXPECT_EQ(status.error_message(), "weights.convert_from (MHA): " + Unusable("/etc"));
  // A bad layer index too is named before the spec is asked for.
  v1::ConfigureRequest negative;
  negative.mutable_weights()->mutable_checkpoint()->set_path("model.safetensors");
  negative.mutable_weights()->mutable_checkpoint()->set_layer_index(-1);
  status = Configure(stub(), negative, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("weights.checkpoint.layer_index = -1"));
  ExpectServing();
}

// Without --checkpoint_root, no path is loaded at all.
class NoCheckpointRootTest : public ServerTest {};

TEST_F(NoCheckpointRootTest, CheckpointsByPathAreRefused) {
  ScratchDirs dirs;
  v1::ConfigureRequest request = SeedConfigure(TestSpec(), 0);
  request.mutable_weights()->mutable_checkpoint()->set_path(dirs.root() + "/model.safetensors");
  v1::ConfigureResponse response;
  const grpc::Status status = Configure(stub(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("start it with --checkpoint_root"));
  // Without a spec the answer is the same, not "spec: required".
  request.clear_spec();
  const grpc::Status without_spec = Configure(stub(), request, &response);
  EXPECT_EQ(without_spec.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << Describe(without_spec);
  EXPECT_THAT(without_spec.error_message(), HasSubstr("start it with --checkpoint_root"));
}

}  // namespace
}  // namespace attnserve::server_test

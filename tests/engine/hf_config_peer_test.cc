// kernels/model/hf_config.h against the peer cases: each case directory written by
// tests/peer/make_peer_cases.py holds the config.json that transformers' save_pretrained wrote,
// the layer it recorded (case.json "layer_index") and spec.json, which the Python side derived
// from the instantiated attention module itself (its scaling, sliding_window, biases, norms) and
// checked with its float64 re-implementation before peer_test checked the engine against
// transformers. The spec read from config.json by our C++ mapping must be that same spec.
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "kernels/model/hf_config.h"
#include "kernels/spec/layer_spec_json.h"
#include "tests/reference/peer_case.h"

namespace attnserve {
namespace {

namespace fs = std::filesystem;

TEST(HfConfigPeerTest, ConfigJsonGivesTheSpecTheModuleHad) {
  const fs::path root = reference::PeerCasesRoot("ATTNSERVE_PEER_CASES", ATTNSERVE_PEER_CASES_DIR);
  ASSERT_TRUE(fs::is_directory(root)) << root << " (written by the peer_cases_generate test)";
  int checked = 0;
  for (const fs::path& dir : reference::PeerCaseDirs(root, {"config.json", "spec.json"})) {
    SCOPED_TRACE(dir.filename().string());
    absl::StatusOr<reference::PeerCaseInfo> info = reference::ReadCaseInfo(dir);
    ASSERT_TRUE(info.ok()) << info.status();
    const int layer_index = info->layer_index;
    absl::StatusOr<std::string> config = reference::ReadText(dir / "config.json");
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<LayerSpec> from_config = LayerSpecFromHfConfig(*config, layer_index);
    ASSERT_TRUE(from_config.ok()) << from_config.status();
    absl::StatusOr<LayerSpec> recorded = reference::ReadRecordedSpec(dir);
    ASSERT_TRUE(recorded.ok()) << recorded.status();
    EXPECT_EQ(LayerSpecDifference(*from_config, *recorded), "")
        << "layer " << layer_index << ": config.json vs spec.json";
    ++checked;
  }
  // Llama (3), Qwen2 (2), Mistral, DeepSeek-V3 (3) and Llama 3.1 at least; more as families join.
  EXPECT_GE(checked, 10) << "fewer peer cases with a config.json than the generator writes";
}

}  // namespace
}  // namespace attnserve

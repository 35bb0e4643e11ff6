// kernels/model/hf_config.h against the peer cases: each case directory written by
// tests/peer/make_peer_cases.py holds the config.json that transformers' save_pretrained wrote,
// the layer it recorded (case.json "layer_index") and spec.json, which the Python side derived
// from the instantiated attention module itself (its scaling, sliding_window, biases, norms) and
// checked with its float64 re-implementation before peer_test checked the engine against
// transformers. The spec read from config.json by our C++ mapping must be that same spec.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "kernels/model/hf_config.h"
#include "kernels/spec/layer_spec_json.h"
#include "nlohmann/json.hpp"

namespace attnserve {
namespace {

namespace fs = std::filesystem;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(HfConfigPeerTest, ConfigJsonGivesTheSpecTheModuleHad) {
  const char* env = std::getenv("ATTNSERVE_PEER_CASES");
  const fs::path root = env != nullptr && *env ? env : ATTNSERVE_PEER_CASES_DIR;
  ASSERT_TRUE(fs::is_directory(root)) << root << " (written by the peer_cases_generate test)";
  int checked = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(root)) {
    const fs::path dir = entry.path();
    if (!fs::exists(dir / "config.json") || !fs::exists(dir / "spec.json")) continue;
    SCOPED_TRACE(dir.filename().string());
    const nlohmann::json case_info = nlohmann::json::parse(ReadText(dir / "case.json"));
    const int layer_index = case_info.at("layer_index").get<int>();
    absl::StatusOr<LayerSpec> from_config =
        LayerSpecFromHfConfig(ReadText(dir / "config.json"), layer_index);
    ASSERT_TRUE(from_config.ok()) << from_config.status();
    absl::StatusOr<LayerSpec> recorded = LayerSpecFromJson(ReadText(dir / "spec.json"));
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

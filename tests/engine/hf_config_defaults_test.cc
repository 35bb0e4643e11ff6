// kernels/model/hf_config.h on config.json files with keys missing: a missing key means what
// transformers' config class defaults it to. tests/peer/make_config_variants.py (the ctest fixture
// hf_config_variants_generate) writes, for every supported family, a full config.json and that
// config with each of its keys deleted in turn, and for each layer what transformers resolves: the
// spec read off the instantiated attention module, or a refusal where transformers itself refuses
// the config (or resolves it to something attnserve does not implement). Our mapping must give the
// same spec, or refuse.
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/model/hf_config.h"
#include "kernels/spec/layer_spec_json.h"
#include "nlohmann/json.hpp"

namespace attnserve {
namespace {

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(HfConfigDefaultsTest, EveryDeletedKeyMeansTheConfigClassDefault) {
  const char* env = std::getenv("ATTNSERVE_HF_CONFIG_VARIANTS");
  const std::string path = env != nullptr && *env ? env : ATTNSERVE_HF_CONFIG_VARIANTS;
  const std::string text = ReadText(path);
  ASSERT_FALSE(text.empty()) << path << " (written by the hf_config_variants_generate test)";
  const nlohmann::json root = nlohmann::json::parse(text);
  std::map<std::string, int> variants_per_family;
  int checked = 0;
  for (const nlohmann::json& variant : root.at("variants")) {
    const std::string family = variant.at("family").get<std::string>();
    const std::string deleted =
        variant.at("deleted").is_null() ? "(nothing)" : variant.at("deleted").get<std::string>();
    const std::string config = variant.at("config").dump();
    ++variants_per_family[family];
    for (const nlohmann::json& layer : variant.at("layers")) {
      const int layer_index = layer.at("layer_index").get<int>();
      SCOPED_TRACE(family + " without " + deleted + ", layer " + std::to_string(layer_index));
      absl::StatusOr<LayerSpec> ours = LayerSpecFromHfConfig(config, layer_index);
      ++checked;
      if (layer.at("spec").is_null()) {
        EXPECT_FALSE(ours.ok()) << "transformers refuses (" << layer.at("refused").get<std::string>()
                                << ") but attnserve accepts: " << LayerSpecSummary(*ours);
        continue;
      }
      absl::StatusOr<LayerSpec> theirs = LayerSpecFromJson(layer.at("spec").dump());
      if (!theirs.ok()) {
        ADD_FAILURE() << "the recorded spec does not read: " << theirs.status() << "\n"
                      << layer.at("spec").dump();
        continue;
      }
      if (!ours.ok()) {
        ADD_FAILURE() << "refused: " << ours.status() << "; transformers gives "
                      << LayerSpecSummary(*theirs);
        continue;
      }
      EXPECT_EQ(LayerSpecDifference(*ours, *theirs), "") << "attnserve vs transformers";
    }
  }
  // Every family kernels/model/hf_config.h supports but BLOOM and MPT (ALiBi, mapped apart), each
  // with dozens of keys.
  EXPECT_EQ(variants_per_family.size(), 15u);
  for (const auto& [family, count] : variants_per_family) {
    EXPECT_GE(count, 60) << family;
  }
  EXPECT_GE(checked, 1000);
}

}  // namespace
}  // namespace attnserve

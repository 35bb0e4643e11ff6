// The README's model-family table as data: for each family, the attention layers of its released
// configs (as kernels/model/hf_config.h maps them, e.g. tests/engine/hf_config_test.cc) and how
// each backend's capability table (kernels/capabilities.h) answers them. attnserve_capabilities
// prints the table and checks README.md against it, so its CPU and GPU columns are the tables'
// answers, not prose.
#ifndef ATTNSERVE_CLIENT_TOOLS_MODEL_FAMILIES_H_
#define ATTNSERVE_CLIENT_TOOLS_MODEL_FAMILIES_H_

#include <string>
#include <vector>

#include "kernels/capabilities.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

// One attention layer of a family's released config. Optional: a form some checkpoints or
// settings use (Qwen2.5 with YaRN); a backend refusing it still serves the family.
struct FamilyLayer {
  std::string label;  // e.g. "Llama-3.1-8B", "YaRN"
  LayerSpec spec;
  bool optional = false;
};

struct ModelFamily {
  std::string name;   // README's first column, verbatim.
  std::string needs;  // README's second column, verbatim.
  std::vector<FamilyLayer> layers;
  // Said of every backend that serves the family: a limit of the checkpoint loader, not a backend.
  std::string note;
};

const std::vector<ModelFamily>& ModelFamilies();

// A backend's cell: "yes", with the head dims it is built for and the optional forms it refuses,
// or "refused (<what>)" naming every gap (CapabilityGap::short_name) of the required layers.
std::string FamilyCell(const BackendCapabilities& capabilities, const ModelFamily& family);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_TOOLS_MODEL_FAMILIES_H_

// attnserve_capabilities: what each backend serves, from the backends' own capability tables
// (kernels/capabilities.h), as markdown, and the README check.
//
//   attnserve_capabilities                      both tables: capabilities, then model families
//   attnserve_capabilities --families           the model-family table only
//   attnserve_capabilities --check_readme=PATH  exit 1 listing every row of PATH's model-family
//                                               table that disagrees with the tables (ctest
//                                               readme_capabilities_test)
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/tools/model_families.h"
#include "kernels/base/command_line_usage.h"
#include "kernels/capabilities.h"
#include "kernels/cpu/cpu_capabilities.h"
#include "kernels/cuda/cuda_capabilities.h"
#include "kernels/kv/quantization.h"

ABSL_FLAG(bool, markdown, true,
          "Print the capability table and the model-family table as markdown (the default).");
ABSL_FLAG(bool, families, false, "Print only the model-family table (README.md's columns).");
ABSL_FLAG(std::string, check_readme, "",
          "Check this README.md's model-family table against the capability tables; exit 1 on "
          "any difference.");

namespace attnserve {
namespace {

std::string YesNo(bool b) { return b ? "yes" : "no"; }

template <typename T, typename Name>
std::string Names(const std::vector<T>& values, Name name, const std::string& empty) {
  std::vector<std::string> names;
  for (const T& v : values) names.push_back(std::string(name(v)));
  return names.empty() ? empty : absl::StrJoin(names, ", ");
}

std::vector<std::pair<std::string, std::string>> Rows(const BackendCapabilities& c) {
  return {
      {"variants", Names(c.variants, VariantName, "none")},
      {"head dims (MHA/MQA/GQA)", c.head_dims.empty() ? "any" : absl::StrJoin(c.head_dims, ", ")},
      {"compute dtypes", Names(c.compute_dtypes, DTypeName, "none")},
      {"KV formats", Names(c.kv_formats, KvStorageFormatName, "none")},
      {"RoPE scalings", Names(c.rope_scalings, RopeScalingTypeName, "none")},
      {"YaRN attention factor", YesNo(c.yarn_attention_factor)},
      {"variations", c.variations.empty() ? "none" : absl::StrJoin(c.variations, ", ")},
      {"Fork", YesNo(c.fork)},
      {"Export/Import", YesNo(c.export_import)},
      {"hybrid stacks", YesNo(c.stacks)},
  };
}

void PrintCapabilities() {
  const auto cpu = Rows(CpuCapabilities());
  const auto gpu = Rows(CudaCapabilities());
  std::printf("| capability | CPU | GPU |\n| --- | --- | --- |\n");
  for (size_t i = 0; i < cpu.size(); ++i) {
    std::printf("| %s | %s | %s |\n", cpu[i].first.c_str(), cpu[i].second.c_str(),
                gpu[i].second.c_str());
  }
}

// family, needs, CPU, GPU: the README's first four columns.
std::vector<std::vector<std::string>> FamilyRows() {
  std::vector<std::vector<std::string>> rows;
  for (const ModelFamily& f : ModelFamilies()) {
    rows.push_back(
        {f.name, f.needs, FamilyCell(CpuCapabilities(), f), FamilyCell(CudaCapabilities(), f)});
  }
  return rows;
}

void PrintFamilies() {
  std::printf(
      "| family (model_type) | what its attention needs | CPU | GPU |\n"
      "| --- | --- | --- | --- |\n");
  for (const auto& row : FamilyRows()) std::printf("| %s |\n", absl::StrJoin(row, " | ").c_str());
}

// The rows of the table under "## Model families", split into cells.
std::vector<std::vector<std::string>> ReadmeRows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  bool in_section = false, in_table = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "## ")) {
      if (in_section) break;
      in_section = line == "## Model families";
      continue;
    }
    if (!in_section) continue;
    if (!absl::StartsWith(line, "|")) {
      if (in_table) break;
      continue;
    }
    if (!in_table) {  // The header.
      in_table = true;
      continue;
    }
    if (absl::StartsWith(line, "| ---")) continue;
    line = absl::StripSuffix(absl::StripPrefix(line, "| "), " |");
    rows.push_back(absl::StrSplit(line, " | "));
  }
  return rows;
}

int CheckReadme(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "%s: cannot read\n", path.c_str());
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<std::vector<std::string>> readme = ReadmeRows(text.str());
  const std::vector<std::vector<std::string>> want = FamilyRows();
  const char* const columns[] = {"family", "needs", "CPU", "GPU"};
  std::vector<std::string> problems;
  // A family's layers must be layers the engine accepts, or its cells would say nothing.
  for (const ModelFamily& f : ModelFamilies()) {
    for (const FamilyLayer& layer : f.layers) {
      if (absl::Status s = ValidateLayerSpec(layer.spec); !s.ok()) {
        problems.push_back(absl::StrCat("'", f.name, "', ", layer.label, ": ", s.message()));
      }
    }
  }
  for (const auto& row : want) {
    const auto it = std::find_if(readme.begin(), readme.end(),
                                 [&](const auto& r) { return !r.empty() && r[0] == row[0]; });
    if (it == readme.end()) {
      problems.push_back(absl::StrCat("no row for '", row[0], "'"));
      continue;
    }
    for (size_t i = 1; i < row.size(); ++i) {
      const std::string have = i < it->size() ? (*it)[i] : "(missing)";
      if (have != row[i]) {
        problems.push_back(absl::StrCat("'", row[0], "', ", columns[i], ": README has '", have,
                                        "', the capability tables say '", row[i], "'"));
      }
    }
  }
  for (const auto& r : readme) {
    if (std::none_of(want.begin(), want.end(), [&](const auto& w) { return w[0] == r[0]; })) {
      problems.push_back(absl::StrCat("row '", r.empty() ? "" : r[0],
                                      "' is not in client/tools/model_families.cc"));
    }
  }
  if (problems.empty()) {
    std::printf("%s: the model-family table agrees with the capability tables (%zu rows)\n",
                path.c_str(), want.size());
    return 0;
  }
  for (const std::string& p : problems) std::fprintf(stderr, "%s: %s\n", path.c_str(), p.c_str());
  std::fprintf(
      stderr,
      "Regenerate the CPU/GPU columns with `attnserve_capabilities --families` (the tables "
      "are kernels/cpu/cpu_capabilities.cc and kernels/cuda/cuda_capabilities.cc; the "
      "families client/tools/model_families.cc).\n");
  return 1;
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  attnserve::SetCommandLineUsage(
      "attnserve_capabilities",
      "What each backend serves, from its capability table (kernels/capabilities.h), and the "
      "README's model-family columns generated from them.",
      {"client/tools/capabilities_main.cc"});
  absl::ParseCommandLine(argc, argv);
  const std::string readme = absl::GetFlag(FLAGS_check_readme);
  if (!readme.empty()) return attnserve::CheckReadme(readme);
  if (!absl::GetFlag(FLAGS_families)) {
    attnserve::PrintCapabilities();
    std::printf("\n");
  }
  attnserve::PrintFamilies();
  return 0;
}

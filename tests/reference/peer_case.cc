#include "tests/reference/peer_case.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/model/safetensors.h"
#include "kernels/spec/layer_spec_json.h"
#include "nlohmann/json.hpp"

namespace attnserve::reference {

namespace fs = std::filesystem;

fs::path PeerCasesRoot(const char* env_var, const std::string& default_dir) {
  const char* env = std::getenv(env_var);
  return env != nullptr && *env != '\0' ? fs::path(env) : fs::path(default_dir);
}

std::vector<fs::path> PeerCaseDirs(const fs::path& root, const std::vector<std::string>& required) {
  std::vector<fs::path> dirs;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory(ec)) continue;
    if (std::all_of(required.begin(), required.end(),
                    [&](const std::string& file) { return fs::exists(entry.path() / file, ec); })) {
      dirs.push_back(entry.path());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

absl::StatusOr<std::string> ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<PeerCaseInfo> ReadCaseInfo(const fs::path& dir) {
  absl::StatusOr<std::string> text = ReadText(dir / "case.json");
  if (!text.ok()) return text.status();
  const nlohmann::json meta = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object() || !meta.contains("layer_index") ||
      !meta["layer_index"].is_number_integer() ||
      (meta.contains("prefill_split") && !meta["prefill_split"].is_number_integer())) {
    return absl::InvalidArgumentError(
        "case.json: expected an object with integer layer_index and prefill_split");
  }
  PeerCaseInfo info;
  info.layer_index = meta["layer_index"].get<int>();
  if (meta.contains("prefill_split")) info.prefill_split = meta["prefill_split"].get<int64_t>();
  return info;
}

absl::StatusOr<LayerSpec> ReadRecordedSpec(const fs::path& dir) {
  absl::StatusOr<std::string> text = ReadText(dir / "spec.json");
  if (!text.ok()) return text.status();
  absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(*text);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat("spec.json: ", spec.status().message()));
  }
  return spec;
}

absl::StatusOr<PeerIo> ReadPeerIo(const fs::path& dir) {
  absl::StatusOr<SafetensorsFile> io = SafetensorsFile::Open((dir / "io.safetensors").string());
  if (!io.ok()) return io.status();
  PeerIo out;
  for (auto [name, tensor] : {std::pair{"hidden", &out.hidden}, std::pair{"expected", &out.expected}}) {
    absl::StatusOr<Tensor> t = io->Read(name);
    if (!t.ok()) return t.status();
    *tensor = *std::move(t);
  }
  const std::vector<std::string> names = io->names();
  out.has_expected_split =
      std::find(names.begin(), names.end(), "expected_split") != names.end();
  if (out.has_expected_split) {
    absl::StatusOr<Tensor> t = io->Read("expected_split");
    if (!t.ok()) return t.status();
    out.expected_split = *std::move(t);
  }
  absl::StatusOr<Tensor> positions = io->Read("positions");
  if (!positions.ok()) return positions.status();
  if (positions->rank() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("positions: rank ", positions->rank(), ", not 1"));
  }
  // Positions are stored as F32 (our reader has no integer dtypes); they must be exact integers.
  for (float p : positions->ToFloats()) {
    if (p != std::floor(p) || p < 0.0f || p > (1 << 24)) {
      return absl::InvalidArgumentError(absl::StrCat("positions: ", p, " is not a small integer"));
    }
    out.positions.push_back(static_cast<int64_t>(p));
  }
  return out;
}

}  // namespace attnserve::reference

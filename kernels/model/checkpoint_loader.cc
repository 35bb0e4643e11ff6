#include "kernels/model/checkpoint_loader.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "kernels/base/clip_for_message.h"
#include "kernels/base/path_confinement.h"
#include "kernels/base/regular_file.h"
#include "kernels/model/safetensors.h"
#include "nlohmann/json.hpp"

namespace attnserve {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kSingleFileName[] = "model.safetensors";
constexpr char kIndexFileName[] = "model.safetensors.index.json";

// True when `name` starts with one of `prefixes`.
bool UnderAny(absl::string_view name, const std::vector<std::string>& prefixes) {
  for (const std::string& prefix : prefixes) {
    if (absl::StartsWith(name, prefix)) return true;
  }
  return false;
}

// Where each tensor of the checkpoint lives. Only names under the layer's candidate prefixes
// (CheckpointNaming) are kept; then only those under the one chosen.
struct CheckpointLayout {
  std::string description;                      // The file or index named in error messages.
  std::map<std::string, std::string> location;  // Full tensor name -> safetensors file path.
};

const char* BoolName(bool value) { return value ? "true" : "false"; }

// The spec's sizes that determine weight shapes, for error messages:
// "gqa, d_model=512, num_heads=8, num_kv_heads=2, head_dim=64".
std::string SpecShapeFields(const LayerSpec& spec) {
  if (spec.variant == AttentionVariant::kMLA) {
    const MlaDims& m = spec.mla;
    return absl::StrCat("mla, d_model=", spec.d_model, ", num_heads=", spec.num_heads,
                        ", q_lora_rank=", m.q_lora_rank, ", kv_lora_rank=", m.kv_lora_rank,
                        ", qk_nope_head_dim=", m.qk_nope_head_dim,
                        ", qk_rope_head_dim=", m.qk_rope_head_dim, ", v_head_dim=", m.v_head_dim);
  }
  return absl::StrCat(VariantName(spec.variant), ", d_model=", spec.d_model,
                      ", num_heads=", spec.num_heads, ", num_kv_heads=", spec.num_kv_heads,
                      ", head_dim=", spec.head_dim, ", qkv_bias=", BoolName(spec.qkv_bias),
                      ", o_bias=", BoolName(spec.o_bias));
}

// The spec field that makes `short_name` (a name without the layer prefix) expected or not.
std::string GoverningField(const LayerSpec& spec, absl::string_view short_name) {
  if (absl::EndsWith(short_name, ".bias")) {
    return absl::StartsWith(short_name, "o_proj")
               ? absl::StrCat("o_bias=", BoolName(spec.o_bias))
               : absl::StrCat("qkv_bias=", BoolName(spec.qkv_bias));
  }
  if (short_name == "sinks") {
    return absl::StrCat("attention_sinks=", BoolName(spec.attention_sinks));
  }
  if (short_name == "q_norm.weight" || short_name == "k_norm.weight" ||
      absl::StartsWith(short_name, "q_layernorm.") ||
      absl::StartsWith(short_name, "k_layernorm.")) {
    return absl::StrCat("qk_norm=", QkNormName(spec.qk_norm));
  }
  if (spec.variant == AttentionVariant::kMLA &&
      (absl::StartsWith(short_name, "q_proj") || absl::StartsWith(short_name, "q_a_") ||
       absl::StartsWith(short_name, "q_b_"))) {
    return absl::StrCat("mla.q_lora_rank=", spec.mla.q_lora_rank);
  }
  return absl::StrCat("variant=", VariantName(spec.variant));
}

// A learned parameter (".weight" or ".bias"), as opposed to buffers such as rotary_emb.inv_freq
// that old transformers versions saved, or FP8 scales (".weight_scale_inv"), which have their own
// weight next to them.
bool IsParameterName(absl::string_view name) {
  return absl::EndsWith(name, ".weight") || absl::EndsWith(name, ".bias") ||
         absl::EndsWith(name, ".sinks");  // gpt-oss: a bare nn.Parameter.
}

// How q, k and v rows lie in a fused projection.
enum class QkvRows {
  kStacked,             // Phi-3's qkv_proj, MPT's Wqkv: all q rows, then k, then v.
  kInterleavedPerHead,  // BLOOM's query_key_value: view(heads, 3, head_dim), per head q, k, v.
};

// How one family names one layer's attention tensors in its checkpoint. The loader works in the
// generic names of ExpectedWeightShapes (q_proj, k_proj, v_proj, o_proj and the rest); a naming
// says where those are stored.
struct CheckpointNaming {
  absl::string_view family;           // For messages.
  std::vector<std::string> prefixes;  // Where the layer's tensors may be, the first preferred.
  absl::string_view fused_qkv;        // The fused q/k/v projection's name.
  bool fused_required = false;        // false: q/k/v_proj, or the fused one (Phi-3).
  QkvRows rows = QkvRows::kStacked;
  absl::string_view o_proj = "o_proj";
};

// The generic names (and Phi-3's) that CheckpointNaming maps.
constexpr absl::string_view kFusedQkv = "qkv_proj";
constexpr absl::string_view kSplitQkv[] = {"q_proj", "k_proj", "v_proj"};
constexpr absl::string_view kOutProj = "o_proj";

CheckpointNaming LlamaNaming(int layer_index) {
  return {"Llama-style", {HfAttentionPrefix(layer_index)}, kFusedQkv, false, QkvRows::kStacked,
          kOutProj};
}

// The namings to try for `spec`, in order; the first with tensors under one of its prefixes is
// used. BLOOM and MPT name their layers their own way (BloomForCausalLM: transformer.h.N.
// self_attention; MptForCausalLM: transformer.blocks.N.attn; a checkpoint saved from the base
// model, as bigscience's are, lacks the "transformer." part), and are chosen by spec.alibi, which
// hf_config.h sets from model_type. Llama's names come after them, so that an ALiBi layer written
// under q/k/v/o_proj names (attnctl convert) still loads.
std::vector<CheckpointNaming> NamingsFor(const LayerSpec& spec, int layer_index) {
  std::vector<CheckpointNaming> namings;
  const std::string n = absl::StrCat(layer_index);
  if (spec.variant != AttentionVariant::kMLA && spec.alibi == Alibi::kBloom) {
    namings.push_back({"BLOOM",
                       {absl::StrCat("transformer.h.", n, ".self_attention."),
                        absl::StrCat("h.", n, ".self_attention.")},
                       "query_key_value",
                       true,
                       QkvRows::kInterleavedPerHead,
                       "dense"});
  } else if (spec.variant != AttentionVariant::kMLA && spec.alibi == Alibi::kMpt) {
    namings.push_back(
        {"MPT",
         {absl::StrCat("transformer.blocks.", n, ".attn."), absl::StrCat("blocks.", n, ".attn.")},
         "Wqkv",
         true,
         QkvRows::kStacked,
         "out_proj"});
  }
  namings.push_back(LlamaNaming(layer_index));
  return namings;
}

// `generic` (a name of ExpectedWeightShapes, or kFusedQkv's) as the checkpoint stores it.
std::string StoredName(const CheckpointNaming& naming, absl::string_view generic) {
  for (auto [from, to] :
       {std::pair{kOutProj, naming.o_proj}, std::pair{kFusedQkv, naming.fused_qkv}}) {
    absl::string_view rest = generic;
    if (absl::ConsumePrefix(&rest, from) && absl::StartsWith(rest, ".")) {
      return absl::StrCat(to, rest);
    }
  }
  return std::string(generic);
}

// The inverse of StoredName.
std::string GenericName(const CheckpointNaming& naming, absl::string_view stored) {
  for (auto [from, to] :
       {std::pair{naming.o_proj, kOutProj}, std::pair{naming.fused_qkv, kFusedQkv}}) {
    absl::string_view rest = stored;
    if (absl::ConsumePrefix(&rest, from) && absl::StartsWith(rest, ".")) {
      return absl::StrCat(to, rest);
    }
  }
  return std::string(stored);
}

// True when the layer's q, k and v come from the naming's fused projection; then `expected` has
// q/k/v_proj.{weight,bias} replaced by qkv_proj.{weight,bias} (generic names) with their rows
// together. The fused projection is used when the naming requires it (BLOOM, MPT) or the
// checkpoint has it (Phi-3). INVALID_ARGUMENT when the checkpoint has the fused and a separate
// projection both, or when BLOOM's per-head interleave meets a spec with fewer K/V than Q heads.
absl::StatusOr<bool> UseFusedQkv(const LayerSpec& spec, const CheckpointNaming& naming,
                                 const CheckpointLayout& layout, const std::string& prefix,
                                 std::vector<WeightShape>* expected) {
  const std::string fused_weight = absl::StrCat(prefix, naming.fused_qkv, ".weight");
  if (spec.variant == AttentionVariant::kMLA ||
      (!naming.fused_required && !layout.location.contains(fused_weight))) {
    return false;
  }
  for (absl::string_view part : kSplitQkv) {
    const std::string separate = absl::StrCat(prefix, part, ".weight");
    if (layout.location.contains(separate)) {
      return absl::InvalidArgumentError(
          absl::StrCat(layout.description, " has both ", fused_weight, " and ", separate,
                       "; a checkpoint holds either the fused projection or the separate ones"));
    }
  }
  if (naming.rows == QkvRows::kInterleavedPerHead && spec.num_kv_heads != spec.num_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        fused_weight, ": ", naming.family, "'s fused projection interleaves q, k and v per head ",
        "(view(num_heads, 3, head_dim)), which needs num_kv_heads == num_heads, but the spec (",
        SpecShapeFields(spec), ") has ", spec.num_kv_heads, " K/V heads"));
  }
  std::vector<WeightShape> fused;
  int64_t rows = 0, bias_rows = 0;
  int64_t in_features = 0;
  for (const WeightShape& shape : *expected) {
    const absl::string_view name = shape.name;
    bool split_part = false;
    for (absl::string_view part : kSplitQkv) {
      split_part = split_part || absl::StartsWith(name, part);
    }
    if (!split_part) {
      fused.push_back(shape);
    } else if (shape.is_bias) {
      bias_rows += shape.shape[0];
    } else {
      rows += shape.shape[0];
      in_features = shape.shape[1];
    }
  }
  fused.push_back({absl::StrCat(kFusedQkv, ".weight"), {rows, in_features}});
  if (bias_rows > 0) {
    fused.push_back({absl::StrCat(kFusedQkv, ".bias"), {bias_rows}, false, true});
  }
  *expected = std::move(fused);
  return true;
}

// Splits the fused qkv_proj tensors of `weights` into q_proj, k_proj and v_proj (row slices, the
// dtype kept), removing the fused ones. kStacked: rows [q | k | v]; kInterleavedPerHead: head h's
// rows [q_h | k_h | v_h] at h * 3 * head_dim (num_kv_heads == num_heads, UseFusedQkv checked).
void SplitFusedQkv(const LayerSpec& spec, QkvRows order, LayerWeights* weights) {
  const int64_t head_dim = spec.head_dim;
  const int64_t q_rows = int64_t{spec.num_heads} * head_dim;
  const int64_t kv_rows = int64_t{spec.num_kv_heads} * head_dim;
  const int64_t part_rows[] = {q_rows, kv_rows, kv_rows};
  for (absl::string_view suffix : {".weight", ".bias"}) {
    auto it = weights->find(absl::StrCat(kFusedQkv, suffix));
    if (it == weights->end()) continue;
    const Tensor fused = std::move(it->second);
    weights->erase(it);
    const int64_t row_elements = fused.rank() == 2 ? fused.dim(1) : 1;
    const size_t row_bytes = static_cast<size_t>(row_elements) * DTypeSize(fused.dtype());
    int64_t first_row = 0;
    for (int part = 0; part < 3; ++part) {
      std::vector<int64_t> shape = fused.shape();
      shape[0] = part_rows[part];
      Tensor slice(fused.dtype(), shape);
      if (order == QkvRows::kStacked) {
        std::memcpy(slice.data(), fused.data() + first_row * row_bytes,
                    part_rows[part] * row_bytes);
        first_row += part_rows[part];
      } else {
        const size_t head_bytes = head_dim * row_bytes;
        for (int64_t h = 0; h < spec.num_heads; ++h) {
          std::memcpy(slice.data() + h * head_bytes, fused.data() + (h * 3 + part) * head_bytes,
                      head_bytes);
        }
      }
      weights->emplace(absl::StrCat(kSplitQkv[part], suffix), std::move(slice));
    }
  }
}

// StableLM stores the per-head q/k LayerNorm scales as one tensor per head
// (StableLmLayerNormPerHead: q_layernorm.norms.H.weight [head_dim]), where the generic names (and
// Cohere's) hold one [heads, head_dim] tensor (q_norm.weight).
constexpr std::pair<absl::string_view, absl::string_view> kPerHeadNorms[] = {
    {"q_norm", "q_layernorm"}, {"k_norm", "k_layernorm"}};

std::string PerHeadNormName(absl::string_view module, int64_t head) {
  return absl::StrCat(module, ".norms.", head, ".weight");
}

// True when the checkpoint stores the layer's q/k LayerNorm scales per head; then `expected` has
// q_norm.weight and k_norm.weight [heads, head_dim] replaced by one [head_dim] entry per head.
bool UsePerHeadNorms(const LayerSpec& spec, const CheckpointLayout& layout,
                     const std::string& prefix, std::vector<WeightShape>* expected) {
  if (spec.variant == AttentionVariant::kMLA || spec.qk_norm != QkNorm::kLayerNorm ||
      !layout.location.contains(prefix + PerHeadNormName(kPerHeadNorms[0].second, 0))) {
    return false;
  }
  std::vector<WeightShape> per_head;
  for (const WeightShape& shape : *expected) {
    absl::string_view stored;
    for (const auto& [generic, module] : kPerHeadNorms) {
      if (shape.name == absl::StrCat(generic, ".weight")) stored = module;
    }
    if (stored.empty()) {
      per_head.push_back(shape);
      continue;
    }
    for (int64_t head = 0; head < shape.shape[0]; ++head) {
      per_head.push_back({PerHeadNormName(stored, head), {shape.shape[1]}, true});
    }
  }
  *expected = std::move(per_head);
  return true;
}

// Stacks the per-head scales of `weights` into q_norm.weight and k_norm.weight [heads, head_dim]
// (the dtype kept), removing them. INVALID_ARGUMENT when the heads' dtypes differ.
absl::Status StackPerHeadNorms(const LayerSpec& spec, LayerWeights* weights) {
  for (const auto& [generic, module] : kPerHeadNorms) {
    const int64_t heads = generic == "q_norm" ? spec.num_heads : spec.num_kv_heads;
    const DType dtype = weights->at(PerHeadNormName(module, 0)).dtype();
    Tensor stacked(dtype, {heads, int64_t{spec.head_dim}});
    const size_t head_bytes = static_cast<size_t>(spec.head_dim) * DTypeSize(dtype);
    for (int64_t head = 0; head < heads; ++head) {
      auto it = weights->find(PerHeadNormName(module, head));
      if (it->second.dtype() != dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            it->first, " is ", DTypeName(it->second.dtype()), " but ", PerHeadNormName(module, 0),
            " is ", DTypeName(dtype), "; the per-head scales of one norm must share a dtype"));
      }
      std::memcpy(stacked.data() + head * head_bytes, it->second.data(), head_bytes);
      weights->erase(it);
    }
    weights->emplace(absl::StrCat(generic, ".weight"), std::move(stacked));
  }
  return absl::OkStatus();
}

// Where the loader may read files: anywhere (empty root), or only inside `root`.
struct FileAccess {
  std::string root;

  // The path to open for `path`: `path` itself without a root; with one, its realpath when that
  // lies inside the root (opened then with O_NOFOLLOW), else NOT_FOUND saying no more than that,
  // whether the path is missing, unreadable or outside the root (path_confinement.h).
  absl::StatusOr<std::string> PathToOpen(const std::string& path) const {
    if (root.empty()) return path;
    std::optional<std::string> resolved = ResolveInsideRoot(root, path);
    if (!resolved.has_value()) {
      return absl::NotFoundError(absl::StrCat(
          "'", ClipForMessage(path), "' is not a readable file under the checkpoint root"));
    }
    return *std::move(resolved);
  }
  FinalSymlink final_symlink() const {
    return root.empty() ? FinalSymlink::kFollow : FinalSymlink::kRefuse;
  }

  absl::StatusOr<SafetensorsFile> OpenSafetensors(const std::string& path) const {
    absl::StatusOr<std::string> to_open = PathToOpen(path);
    if (!to_open.ok()) return to_open.status();
    return SafetensorsFile::Open(*to_open, final_symlink());
  }
};

// The whole of a small regular file (the index), read without blocking on FIFOs or devices.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const FileAccess& access) {
  absl::StatusOr<std::string> to_open = access.PathToOpen(path);
  if (!to_open.ok()) return to_open.status();
  absl::StatusOr<OpenedFile> file = OpenRegularFile(*to_open, access.final_symlink());
  if (!file.ok()) return file.status();
  const uint64_t size = file->size;
  if (size > kMaxSafetensorsHeaderBytes) {
    close(file->fd);
    return absl::InvalidArgumentError(
        absl::StrCat(ClipForMessage(path), " is ", size, " bytes; an index over ",
                     kMaxSafetensorsHeaderBytes, " bytes is not plausible"));
  }
  std::string text(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pread(file->fd, text.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(file->fd);
  if (done != size) {
    return absl::DataLossError(
        absl::StrCat("reading ", ClipForMessage(path), ": ended early (changed while read?)"));
  }
  return text;
}

// Reads model.safetensors.index.json's weight_map, keeping the entries under `prefixes`.
absl::StatusOr<CheckpointLayout> LayoutFromIndex(const fs::path& dir, const fs::path& index_path,
                                                 const std::vector<std::string>& prefixes,
                                                 const FileAccess& access) {
  const std::string index = index_path.string();
  absl::StatusOr<std::string> text = ReadSmallFile(index, access);
  if (!text.ok()) return text.status();
  const std::string shown = ClipForMessage(index);
  const json root = json::parse(*text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(shown, " is not a JSON object"));
  }
  const auto map_it = root.find("weight_map");
  if (map_it == root.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, " has no \"weight_map\" object (tensor name -> shard file)"));
  }
  CheckpointLayout layout{shown, {}};
  for (const auto& [name, shard] : map_it->items()) {
    if (!UnderAny(name, prefixes)) continue;
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          shown, ": weight_map entry for '", ClipForMessage(name), "' is not a string file name"));
    }
    const fs::path shard_path(shard.get<std::string>());
    // Shards live in the checkpoint directory; refusing absolute paths and ".." keeps a
    // downloaded index from pointing the loader at arbitrary files.
    bool escapes = shard_path.is_absolute() || shard_path.empty();
    for (const fs::path& part : shard_path) escapes = escapes || part == "..";
    if (escapes) {
      return absl::InvalidArgumentError(
          absl::StrCat(shown, ": weight_map entry for '", ClipForMessage(name), "' names shard '",
                       ClipForMessage(shard_path.string()),
                       "', which is not a relative path inside ", ClipForMessage(dir.string())));
    }
    layout.location.emplace(name, (dir / shard_path).string());
  }
  return layout;
}

absl::StatusOr<CheckpointLayout> ResolveLayout(const std::string& path,
                                               const std::vector<std::string>& prefixes,
                                               const FileAccess& access,
                                               std::map<std::string, SafetensorsFile>& open_files) {
  std::error_code error;
  absl::StatusOr<std::string> confined = access.PathToOpen(path);
  if (!confined.ok()) return confined.status();
  const fs::file_status status = fs::status(*confined, error);
  if (error || !fs::exists(status)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint path ", ClipForMessage(path), " does not exist"));
  }
  std::string file_path = path;
  if (fs::is_directory(status)) {
    const fs::path dir(path);
    const fs::path index = dir / kIndexFileName;
    // symlink_status: an entry that is a symlink counts as present wherever it points, so that
    // whether a link's target outside the root exists never changes the answer.
    if (fs::exists(fs::symlink_status(index, error))) {
      return LayoutFromIndex(dir, index, prefixes, access);
    }
    file_path = (dir / kSingleFileName).string();
    if (!fs::exists(fs::symlink_status(file_path, error))) {
      return absl::NotFoundError(absl::StrCat("checkpoint directory ", ClipForMessage(path),
                                              " has neither ", kSingleFileName, " nor ",
                                              kIndexFileName));
    }
  }
  absl::StatusOr<SafetensorsFile> file = access.OpenSafetensors(file_path);
  if (!file.ok()) return file.status();
  CheckpointLayout layout{ClipForMessage(file_path), {}};
  for (const std::string& name : file->names()) {
    if (UnderAny(name, prefixes)) layout.location.emplace(name, file_path);
  }
  open_files.emplace(file_path, *std::move(file));
  return layout;
}

// What the checkpoint has under the prefix, for messages about a missing tensor. `tried`: every
// prefix looked under, when none had tensors.
std::string DescribePresent(const CheckpointLayout& layout, const std::string& prefix,
                            const std::vector<std::string>& tried) {
  if (layout.location.empty()) {
    std::vector<std::string> others;
    for (const std::string& p : tried) {
      if (p != prefix) others.push_back(p);
    }
    return absl::StrCat(
        layout.description, " has no tensors under ", prefix, " at all",
        others.empty() ? "" : absl::StrCat(" (nor under ", absl::StrJoin(others, ", "), ")"),
        " (layer index past the model's num_hidden_layers, or not Hugging Face "
        "Llama/Mistral/Qwen2/DeepSeek names? BLOOM's and MPT's names are read for a spec with "
        "alibi bloom or mpt)");
  }
  std::vector<std::string> short_names;
  for (const auto& [name, file] : layout.location)
    short_names.push_back(name.substr(prefix.size()));
  return absl::StrCat("under ", prefix, " it has: ", absl::StrJoin(short_names, ", "));
}

// The naming and prefix the checkpoint uses: the first of `namings`' prefixes with any tensor
// under it; without any, the first (for the messages). Drops the layout's other names.
std::pair<const CheckpointNaming*, std::string> ChooseNaming(
    const std::vector<CheckpointNaming>& namings, CheckpointLayout* layout) {
  std::pair<const CheckpointNaming*, std::string> chosen{&namings[0], namings[0].prefixes[0]};
  bool found = false;
  for (const CheckpointNaming& naming : namings) {
    for (const std::string& prefix : naming.prefixes) {
      for (const auto& [name, file] : layout->location) {
        found = found || absl::StartsWith(name, prefix);
      }
      if (found) {
        chosen = {&naming, prefix};
        break;
      }
    }
    if (found) break;
  }
  std::erase_if(layout->location,
                [&](const auto& entry) { return !absl::StartsWith(entry.first, chosen.second); });
  return chosen;
}

}  // namespace

std::string HfAttentionPrefix(int layer_index) {
  return absl::StrCat("model.layers.", layer_index, ".self_attn.");
}

absl::StatusOr<LayerWeights> LoadLayerWeightsFromSafetensors(const std::string& path,
                                                             const LayerSpec& spec, int layer_index,
                                                             const std::string& checkpoint_root) {
  if (absl::Status s = ValidateLayerSpec(spec); !s.ok()) return s;
  if (layer_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer_index is ", layer_index, "; it must be >= 0"));
  }
  const std::vector<CheckpointNaming> namings = NamingsFor(spec, layer_index);
  std::vector<std::string> all_prefixes;
  for (const CheckpointNaming& naming : namings) {
    all_prefixes.insert(all_prefixes.end(), naming.prefixes.begin(), naming.prefixes.end());
  }
  std::map<std::string, SafetensorsFile> open_files;  // Path -> file, each shard opened once.
  const FileAccess access{checkpoint_root};
  absl::StatusOr<CheckpointLayout> layout = ResolveLayout(path, all_prefixes, access, open_files);
  if (!layout.ok()) return layout.status();
  const auto [naming_ptr, prefix] = ChooseNaming(namings, &*layout);
  const CheckpointNaming& naming = *naming_ptr;

  // Names first, so that a spec/checkpoint mismatch is reported before any shard is opened.
  // `expected` holds generic names; the checkpoint's are prefix + StoredName(naming, name).
  std::vector<WeightShape> expected = ExpectedWeightShapes(spec);
  absl::StatusOr<bool> fused_qkv = UseFusedQkv(spec, naming, *layout, prefix, &expected);
  if (!fused_qkv.ok()) return fused_qkv.status();
  const bool per_head_norms = UsePerHeadNorms(spec, *layout, prefix, &expected);
  std::set<std::string> expected_names;
  for (const WeightShape& weight : expected) {
    const std::string full_name = prefix + StoredName(naming, weight.name);
    expected_names.insert(full_name);
    if (layout->location.contains(full_name)) continue;
    return absl::NotFoundError(absl::StrCat(
        full_name, " is not in ", layout->description, ", but the spec (", SpecShapeFields(spec),
        ") requires it with shape ", ShapeString(weight.shape), " (",
        GoverningField(spec, weight.name), "); ", DescribePresent(*layout, prefix, all_prefixes)));
  }
  for (const auto& [full_name, file] : layout->location) {
    if (expected_names.contains(full_name) || !IsParameterName(full_name)) continue;
    const std::string short_name = GenericName(naming, full_name.substr(prefix.size()));
    // MosaicML's attn_config.qk_ln: LayerNorms on q and k, which transformers' MptAttention
    // never applies; refused by name.
    if (naming.family == "MPT" &&
        (absl::StartsWith(short_name, "q_ln.") || absl::StartsWith(short_name, "k_ln."))) {
      return absl::InvalidArgumentError(absl::StrCat(
          full_name, " is in ", ClipForMessage(file),
          ": MPT's attn_config.qk_ln (LayerNorm of q and k) is not supported; loading without "
          "it would compute a different layer than the checkpoint's"));
    }
    // Biases, sinks and q/k norms each have a spec field that turns them on.
    const bool is_bias = absl::EndsWith(short_name, ".bias") || short_name == "sinks" ||
                         short_name == "q_norm.weight" || short_name == "k_norm.weight" ||
                         absl::StartsWith(short_name, "q_layernorm.") ||
                         absl::StartsWith(short_name, "k_layernorm.");
    return absl::InvalidArgumentError(absl::StrCat(
        full_name, " is in ", ClipForMessage(file), " but the spec (", SpecShapeFields(spec),
        ") does not use it",
        is_bias ? absl::StrCat(" (the spec has ", GoverningField(spec, short_name),
                               "; set it for this checkpoint)")
                : "",
        "; loading without it would compute a different layer than the checkpoint's",
        is_bias ? "" : " (the checkpoint's attention is another variant or architecture)"));
  }

  // Shapes and dtypes from the headers, before reading any data.
  std::vector<std::pair<const WeightShape*, SafetensorsFile*>> plan;
  for (const WeightShape& weight : expected) {
    const std::string full_name = prefix + StoredName(naming, weight.name);
    const std::string& file_path = layout->location.at(full_name);
    auto file_it = open_files.find(file_path);
    if (file_it == open_files.end()) {
      absl::StatusOr<SafetensorsFile> file = access.OpenSafetensors(file_path);
      if (!file.ok()) {
        return absl::Status(file.status().code(),
                            absl::StrCat(file.status().message(), " (the shard that ",
                                         layout->description, " names for ", full_name, ")"));
      }
      file_it = open_files.emplace(file_path, *std::move(file)).first;
    }
    const SafetensorsFile& file = file_it->second;
    absl::StatusOr<SafetensorsTensorInfo> info = file.info(full_name);
    if (!info.ok()) {
      return absl::NotFoundError(absl::StrCat(full_name, " is not in ", ClipForMessage(file_path),
                                              ", although ", layout->description, " says it is"));
    }
    if (info->shape != weight.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          full_name, " in ", ClipForMessage(file_path), " has shape ", ShapeString(info->shape),
          " but the spec (", SpecShapeFields(spec), ") requires ", ShapeString(weight.shape)));
    }
    if (!info->dtype.has_value()) {
      const bool fp8_scaled = file.contains(full_name + "_scale_inv");
      return absl::UnimplementedError(absl::StrCat(
          full_name, " in ", ClipForMessage(file_path), " is stored as ", info->dtype_name,
          "; only F32, F16 and BF16 weights can be loaded",
          fp8_scaled ? " (this is a block-quantized FP8 checkpoint: dequantize it to BF16 first)"
                     : ""));
    }
    plan.emplace_back(&weight, &file_it->second);
  }

  LayerWeights weights;
  for (const auto& [weight, file] : plan) {
    absl::StatusOr<Tensor> tensor = file->Read(prefix + StoredName(naming, weight->name));
    if (!tensor.ok()) return tensor.status();
    weights.emplace(weight->name, *std::move(tensor));
  }
  if (*fused_qkv) SplitFusedQkv(spec, naming.rows, &weights);
  if (per_head_norms) {
    if (absl::Status s = StackPerHeadNorms(spec, &weights); !s.ok()) return s;
  }
  if (absl::Status s = ValidateLayerWeights(spec, weights); !s.ok()) return s;
  return weights;
}

}  // namespace attnserve

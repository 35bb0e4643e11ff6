#include "client/attnctl/stack_pattern.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/stack/layer_stack.h"

namespace attnserve {

absl::StatusOr<std::vector<LayerSpec>> ExpandStackPattern(const LayerSpec& base,
                                                          absl::string_view pattern) {
  std::vector<LayerSpec> layers;
  if (pattern.empty()) return absl::InvalidArgumentError("--stack: empty pattern");
  for (absl::string_view entry : absl::StrSplit(pattern, ',')) {
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stack: entry '", entry, "' ", why,
                       " (expected sw:<tokens> or global, optionally x<count>, e.g. "
                       "sw:4096x5,global)"));
    };
    absl::string_view kind = entry;
    int count = 1;
    if (const size_t x = entry.rfind('x'); x != absl::string_view::npos) {
      if (!absl::SimpleAtoi(entry.substr(x + 1), &count) || count < 1) {
        return bad("has a count that is not a positive integer");
      }
      kind = entry.substr(0, x);
    }
    LayerSpec layer = base;
    int window = 0;
    if (kind == "global") {
      layer.sliding_window = 0;
    } else if (absl::ConsumePrefix(&kind, "sw:") && absl::SimpleAtoi(kind, &window) &&
               window >= 1) {
      layer.sliding_window = window;
    } else {
      return bad("is not a layer kind");
    }
    if (static_cast<int64_t>(layers.size()) + count > kMaxStackLayers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stack: more than ", kMaxStackLayers, " layers"));
    }
    layers.insert(layers.end(), static_cast<size_t>(count), layer);
  }
  return layers;
}

}  // namespace attnserve

// attnctl's --stack: a hybrid stack written as a short pattern over one base layer spec, e.g.
// "sw:4096x5,global" = 5 sliding-window layers of 4096 tokens, then 1 global layer (Gemma 3's
// 5:1). Entries, comma-separated, bottom first: "sw:<tokens>" (the base with that sliding window)
// or "global" (the base without a window), each optionally followed by "x<count>".
#ifndef ATTNSERVE_CLIENT_ATTNCTL_STACK_PATTERN_H_
#define ATTNSERVE_CLIENT_ATTNCTL_STACK_PATTERN_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

// The layers of `pattern` over `base`. INVALID_ARGUMENT naming --stack and the entry for an
// empty pattern, an unknown entry, a window or count < 1, or more than kMaxStackLayers layers.
absl::StatusOr<std::vector<LayerSpec>> ExpandStackPattern(const LayerSpec& base,
                                                          absl::string_view pattern);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNCTL_STACK_PATTERN_H_

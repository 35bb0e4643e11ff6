// The four layer variants the demo and benchmarks compare, at the comparison's scale
// (docs/comparison.md: d_model = 512, 8 query heads, head_dim 64).
#ifndef ATTNSERVE_CLIENT_COMMON_DEMO_VARIANTS_H_
#define ATTNSERVE_CLIENT_COMMON_DEMO_VARIANTS_H_

#include <string>
#include <vector>

#include "kernels/spec/layer_spec.h"

namespace attnserve {

struct NamedSpec {
  std::string label;  // "MHA", "GQA-4", ...
  LayerSpec spec;
};

// MHA (8 KV heads), GQA-4 (4 KV heads), MQA (1 KV head), all Llama-style with RoPE; and MLA with
// a 256-wide latent (DeepSeek-V2-Lite's shape scaled to d_model 512: no q_lora, nope 64, rope 32,
// v 64). All causal; `window` > 0 adds a sliding window to every variant.
std::vector<NamedSpec> DemoVariants(int d_model, int num_heads, int window);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_COMMON_DEMO_VARIANTS_H_

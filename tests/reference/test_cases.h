// Shared pieces of the engine-vs-reference tests: a catalogue of named layer specs covering every
// variant and option, a reproducible random seed, and a helper that builds a CPU layer.
//
// Header-only because it needs the CPU backend, which attnserve_test_support does not link.
#ifndef ATTNSERVE_TESTS_REFERENCE_TEST_CASES_H_
#define ATTNSERVE_TESTS_REFERENCE_TEST_CASES_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/model/layer_weights.h"
#include "tests/reference/attention_reference.h"

namespace attnserve::reference {

struct NamedSpec {
  std::string name;  // A gtest-safe identifier: [A-Za-z0-9_].
  LayerSpec spec;
};

// MHA/MQA/GQA with d_model 64 unless set otherwise.
inline LayerSpec StandardSpec(int heads, int kv_heads, int head_dim, RopeLayout rope) {
  LayerSpec spec;
  spec.variant = kv_heads == heads ? AttentionVariant::kMHA
                 : kv_heads == 1   ? AttentionVariant::kMQA
                                   : AttentionVariant::kGQA;
  spec.d_model = 64;
  spec.num_heads = heads;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = head_dim;
  spec.rope = rope;
  return spec;
}

inline LayerSpec MlaSpec(int q_lora_rank, int kv_lora_rank, int nope, int rope_dim, int v_dim,
                         RopeLayout rope) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMLA;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.rope = rope;
  spec.mla = {.q_lora_rank = q_lora_rank,
              .kv_lora_rank = kv_lora_rank,
              .qk_nope_head_dim = nope,
              .qk_rope_head_dim = rope_dim,
              .v_head_dim = v_dim,
              .rms_norm_eps = 1e-6f};
  return spec;
}

// Every variant, both RoPE layouts and none, biases, head_dim != d_model / num_heads, an explicit
// softmax scale, a large RoPE theta, non-causal masks and sliding windows.
inline std::vector<NamedSpec> SpecCatalog() {
  std::vector<NamedSpec> specs;
  const auto add = [&](std::string name, LayerSpec spec) {
    specs.push_back({std::move(name), spec});
  };
  add("mha_norope", StandardSpec(4, 4, 16, RopeLayout::kNone));
  {
    LayerSpec s = StandardSpec(4, 4, 16, RopeLayout::kHalf);
    s.qkv_bias = s.o_bias = true;
    add("mha_half_bias", s);
  }
  add("mha_interleaved_hd24", StandardSpec(4, 4, 24, RopeLayout::kInterleaved));
  add("mqa_half", StandardSpec(8, 1, 8, RopeLayout::kHalf));
  {
    LayerSpec s = StandardSpec(8, 2, 16, RopeLayout::kHalf);
    s.qkv_bias = true;
    s.rope_theta = 500000.0;
    add("gqa2_half_bias_hd16_theta5e5", s);
  }
  {
    LayerSpec s = StandardSpec(8, 4, 8, RopeLayout::kInterleaved);
    s.o_bias = true;
    add("gqa4_interleaved_obias", s);
  }
  {
    LayerSpec s = StandardSpec(6, 3, 10, RopeLayout::kHalf);
    s.d_model = 48;
    add("gqa3_half_hd10_d48", s);
  }
  {
    LayerSpec s = StandardSpec(4, 2, 16, RopeLayout::kNone);
    s.softmax_scale = 0.2f;
    add("gqa2_norope_scale02", s);
  }
  {
    LayerSpec s = StandardSpec(4, 4, 16, RopeLayout::kHalf);
    s.causal = false;
    add("mha_half_noncausal", s);
  }
  {
    LayerSpec s = StandardSpec(8, 2, 8, RopeLayout::kNone);
    s.causal = false;
    s.qkv_bias = true;
    add("gqa2_norope_bias_noncausal", s);
  }
  {
    LayerSpec s = StandardSpec(8, 2, 8, RopeLayout::kHalf);
    s.sliding_window = 7;
    add("gqa2_half_window7", s);
  }
  {
    LayerSpec s = StandardSpec(4, 4, 16, RopeLayout::kInterleaved);
    s.sliding_window = 16;
    s.qkv_bias = s.o_bias = true;
    add("mha_interleaved_bias_window16", s);
  }
  {
    LayerSpec s = StandardSpec(4, 1, 16, RopeLayout::kHalf);
    s.sliding_window = 33;
    add("mqa_half_window33", s);
  }
  add("mla_q0_interleaved", MlaSpec(0, 32, 16, 8, 12, RopeLayout::kInterleaved));
  add("mla_q24_half", MlaSpec(24, 16, 8, 4, 16, RopeLayout::kHalf));
  {
    // A large epsilon (the latent's mean square is ~1) so that ignoring it shows.
    LayerSpec s = MlaSpec(16, 32, 12, 8, 8, RopeLayout::kNone);
    s.mla.rms_norm_eps = 0.1f;
    add("mla_q16_norope_eps01", s);
  }
  add("mla_q0_norope_ropedim0", MlaSpec(0, 24, 16, 0, 16, RopeLayout::kNone));
  {
    LayerSpec s = MlaSpec(24, 32, 16, 8, 16, RopeLayout::kInterleaved);
    s.causal = false;
    add("mla_q24_interleaved_noncausal", s);
  }
  {
    LayerSpec s = MlaSpec(0, 32, 16, 8, 12, RopeLayout::kInterleaved);
    s.sliding_window = 9;
    add("mla_q0_interleaved_window9", s);
  }
  return specs;
}

inline NamedSpec FindSpec(const std::string& name) {
  for (const NamedSpec& named : SpecCatalog()) {
    if (named.name == name) return named;
  }
  return {};
}

// A fresh seed per call from std::random_device, or ATTNSERVE_TEST_SEED when set (to reproduce a
// failure: every failure message prints the seed it used).
inline uint64_t TestSeed() {
  if (const char* env = std::getenv("ATTNSERVE_TEST_SEED"); env != nullptr && *env != '\0') {
    return std::strtoull(env, nullptr, 10);
  }
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

inline std::string SeedNote(uint64_t seed) {
  return "seed " + std::to_string(seed) +
         " (rerun with ATTNSERVE_TEST_SEED=" + std::to_string(seed) + ")";
}

// Random nn.Linear-style weights with RMSNorm scales perturbed away from 1.
inline LayerWeights TestWeights(const LayerSpec& spec, uint64_t seed) {
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, seed);
  if (!weights.ok()) return {};
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  PerturbNormScales(*weights, rng);
  return *std::move(weights);
}

// A CPU backend and one layer built by it (the backend outlives the layer).
struct TestEngine {
  std::unique_ptr<AttentionBackend> backend;
  std::unique_ptr<AttentionLayer> layer;
};

inline absl::StatusOr<TestEngine> MakeEngine(const LayerSpec& spec, const LayerWeights& weights,
                                             const KvCacheConfig& kv_config,
                                             CpuBackendOptions options = {.num_threads = 2}) {
  TestEngine engine;
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend(options);
  if (!backend.ok()) return backend.status();
  engine.backend = *std::move(backend);
  absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
      engine.backend->CreateLayer(spec, weights, kv_config);
  if (!layer.ok()) return layer.status();
  engine.layer = *std::move(layer);
  return engine;
}

}  // namespace attnserve::reference

#endif  // ATTNSERVE_TESTS_REFERENCE_TEST_CASES_H_

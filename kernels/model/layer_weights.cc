#include "kernels/model/layer_weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/clip_for_message.h"

namespace attnserve {

namespace {

WeightShape Linear(std::string prefix, int64_t out_features, int64_t in_features) {
  return {absl::StrCat(prefix, ".weight"), {out_features, in_features}};
}

WeightShape Bias(std::string prefix, int64_t features) {
  return {absl::StrCat(prefix, ".bias"), {features}, false, true};
}

WeightShape NormScale(std::string prefix, int64_t features, float init = 1.0f) {
  return {absl::StrCat(prefix, ".weight"), {features}, true, false, init};
}

// FNV-1a: a hash that is the same on every platform and build (absl::Hash is salted per process).
uint64_t StableHash(absl::string_view text) {
  uint64_t hash = 1469598103934665603ull;
  for (char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace

std::vector<WeightShape> ExpectedWeightShapes(const LayerSpec& spec) {
  const int64_t d = spec.d_model;
  const int64_t h = spec.num_heads;
  std::vector<WeightShape> shapes;
  if (spec.variant == AttentionVariant::kMLA) {
    const MlaDims& m = spec.mla;
    const int64_t qk = int64_t{m.qk_nope_head_dim} + m.qk_rope_head_dim;
    if (m.q_lora_rank == 0) {
      shapes.push_back(Linear("q_proj", h * qk, d));
    } else {
      shapes.push_back(Linear("q_a_proj", m.q_lora_rank, d));
      shapes.push_back(NormScale("q_a_layernorm", m.q_lora_rank));
      shapes.push_back(Linear("q_b_proj", h * qk, m.q_lora_rank));
    }
    shapes.push_back(Linear("kv_a_proj_with_mqa", int64_t{m.kv_lora_rank} + m.qk_rope_head_dim, d));
    shapes.push_back(NormScale("kv_a_layernorm", m.kv_lora_rank));
    shapes.push_back(
        Linear("kv_b_proj", h * (int64_t{m.qk_nope_head_dim} + m.v_head_dim), m.kv_lora_rank));
    shapes.push_back(Linear("o_proj", d, h * m.v_head_dim));
    return shapes;
  }
  const int64_t q = h * spec.head_dim;
  const int64_t kv = int64_t{spec.num_kv_heads} * spec.head_dim;
  shapes.push_back(Linear("q_proj", q, d));
  shapes.push_back(Linear("k_proj", kv, d));
  shapes.push_back(Linear("v_proj", kv, d));
  shapes.push_back(Linear("o_proj", d, q));
  if (spec.qkv_bias) {
    shapes.push_back(Bias("q_proj", q));
    shapes.push_back(Bias("k_proj", kv));
    shapes.push_back(Bias("v_proj", kv));
  }
  if (spec.o_bias) shapes.push_back(Bias("o_proj", d));
  if (spec.qk_norm != QkNorm::kNone) {
    const float init = spec.qk_norm == QkNorm::kRmsUnitOffset ? 0.0f : 1.0f;
    for (const auto& [name, heads] :
         {std::pair{"q_norm", spec.num_heads}, std::pair{"k_norm", spec.num_kv_heads}}) {
      WeightShape scale = NormScale(name, QkNormWidth(spec, heads), init);
      // A scale per head, stored as CohereLayerNorm's [heads, head_dim].
      if (spec.qk_norm == QkNorm::kLayerNorm) scale.shape = {heads, spec.head_dim};
      shapes.push_back(std::move(scale));
    }
  }
  if (spec.attention_sinks) shapes.push_back({"sinks", {h}});
  return shapes;
}

absl::Status ValidateLayerWeights(const LayerSpec& spec, const LayerWeights& weights) {
  std::set<std::string> expected_names;
  for (const WeightShape& expected : ExpectedWeightShapes(spec)) {
    expected_names.insert(expected.name);
    auto it = weights.find(expected.name);
    if (it == weights.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight '", expected.name, "' is missing; the ", VariantName(spec.variant),
                       " spec needs it with shape ", ShapeString(expected.shape)));
    }
    if (absl::Status s =
            CheckShape(it->second, expected.shape, absl::StrCat("weight '", expected.name, "'"));
        !s.ok()) {
      return s;
    }
  }
  for (const auto& [name, tensor] : weights) {
    if (!expected_names.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("weight '", ClipForMessage(name), "' ",
                                                     tensor.DebugString(), " is not used by the ",
                                                     VariantName(spec.variant), " spec"));
    }
  }
  // Last, after the shapes: a NaN or Inf weight would make every output of the session NaN with
  // status OK. Inline weights and checkpoints both pass through here.
  for (const auto& [name, tensor] : weights) {
    const int64_t bad = FirstNonFiniteElement(tensor);
    if (bad < 0) continue;
    std::string index;
    int64_t rest = bad;
    for (size_t d = tensor.shape().size(); d-- > 0;) {
      const int64_t dim = tensor.shape()[d];
      index = absl::StrCat(rest % dim, index.empty() ? "" : ", ", index);
      rest /= dim;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("weight '", ClipForMessage(name), "' has a NaN or infinite value at element ",
                     bad, " (index [", index, "]); weights must be finite"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LayerWeights> RandomLayerWeights(const LayerSpec& spec, uint64_t seed,
                                                const std::function<bool()>& cancelled) {
  if (absl::Status s = ValidateLayerSpec(spec); !s.ok()) return s;
  const std::vector<WeightShape> shapes = ExpectedWeightShapes(spec);
  std::vector<Tensor> tensors;
  for (const WeightShape& expected : shapes) tensors.emplace_back(DType::kF32, expected.shape);
  std::atomic<bool> stop{false};
  // One tensor per thread: each tensor's stream is sequential, the tensors are independent.
  const auto fill = [&](size_t t) {
    const WeightShape& expected = shapes[t];
    float* values = tensors[t].f32();
    const int64_t count = tensors[t].num_elements();
    if (expected.is_norm_scale) {
      for (int64_t i = 0; i < count; ++i) values[i] = expected.norm_scale_init;
      return;
    }
    // A bias shares its layer's fan-in; find it from the matching weight's second dimension.
    int64_t fan_in = expected.shape.size() == 2 ? expected.shape[1] : 0;
    if (expected.is_bias) {
      const std::string weight_name =
          expected.name.substr(0, expected.name.size() - absl::string_view(".bias").size()) +
          ".weight";
      for (const WeightShape& other : shapes) {
        if (other.name == weight_name) fan_in = other.shape[1];
      }
    }
    if (expected.name == "sinks") fan_in = 1;  // One logit per head, no input.
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
    std::mt19937_64 rng(seed ^ StableHash(expected.name));
    std::uniform_real_distribution<float> uniform(-bound, bound);
    constexpr int64_t kPollEvery = int64_t{1} << 20;  // ~10 ms of drawing between polls.
    for (int64_t begin = 0; begin < count; begin += kPollEvery) {
      if (stop.load(std::memory_order_relaxed)) return;
      if (cancelled && cancelled()) {
        stop.store(true, std::memory_order_relaxed);
        return;
      }
      const int64_t end = std::min(count, begin + kPollEvery);
      for (int64_t i = begin; i < end; ++i) values[i] = uniform(rng);
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < shapes.size(); ++t) threads.emplace_back(fill, t);
  if (!shapes.empty()) fill(0);
  for (std::thread& thread : threads) thread.join();
  if (stop.load()) return absl::CancelledError("drawing the weights was cancelled");
  LayerWeights weights;
  for (size_t t = 0; t < shapes.size(); ++t) weights.emplace(shapes[t].name, std::move(tensors[t]));
  return weights;
}

std::vector<float> FloatsOrEmpty(const LayerWeights& weights, const std::string& name) {
  auto it = weights.find(name);
  return it == weights.end() ? std::vector<float>() : it->second.ToFloats();
}

}  // namespace attnserve

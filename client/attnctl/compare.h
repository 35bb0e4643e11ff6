// `attnctl compare`: the variant comparison of docs/comparison.md, measured on a running server.
//
// From one MHA layer (--base, default d_model 512, 8 heads of 64, RoPE) it configures
//   MHA                 the base layer, weights from --seed;
//   GQA-n ... MQA       the same MHA weights with K/V heads mean-pooled (WeightSource.convert_from,
//                       kernels/model/kv_head_pooling.h): n = num_heads / 2, num_heads / 4, and 1;
//   MLA-<latent>        DeepSeek-V2-style MLA (latent 256, nope = v = head_dim, rope head_dim / 2),
//                       its own weights from the seed (not a conversion: nothing to compare to);
//   SW-<window>         the MHA layer, same weights, with a Mistral sliding window;
// and for each, at every length L and batch B, prefills B requests of L tokens (inputs seeded by
// (seed, L, repeat), so every variant sees the same inputs), decodes a few steps, reads the KV
// bytes the server holds, and releases them. Repeated --repeats times, it reports per variant:
// parameters, KV bytes per token, KV bytes at each length (B x tokens x bytes/token, and what the
// server holds in whole pages), prefill and per-step decode latency p50/p90 (server compute time;
// client wall time in the JSON), and, for the forms with MHA's weights, the relative L2 error and
// cosine of their outputs (prefill and decode, repeat 0) against MHA's.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_COMPARE_H_
#define ATTNSERVE_CLIENT_ATTNCTL_COMPARE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/common/client.h"
#include "kernels/core/tensor.h"
#include "kernels/kv/storage_format.h"
#include "kernels/spec/layer_spec.h"
#include "nlohmann/json.hpp"

namespace attnserve {

struct CompareOptions {
  LayerSpec base;  // An MHA spec.
  std::vector<int64_t> lengths = {128, 256, 512, 1024, 2048};
  int batch = 4;
  int repeats = 5;
  int decode_steps = 8;  // Decode calls (of `batch` steps each) after each prefill.
  int mla_latent = 256;
  int window = 0;  // Of the sliding-window form; 0 = a quarter of the longest length.
  DType kv_dtype = DType::kF32;
  KvQuantization kv_quantization = KvQuantization::kNone;  // 8-bit KV pages (--kv_quant).
  uint64_t seed = 1;  // Weights and inputs.
  enum class Format { kTable, kJson, kCsv } format = Format::kTable;
  std::string save_json_path;  // Also write the JSON here; empty = no.
  std::string plot_path;       // PNG to draw with plot_script; empty = no plot.
  std::string plot_python;     // Interpreter with matplotlib (client/python/requirements.txt).
  std::string plot_script;     // client/python/plot_compare.py
};

// The default base layer: mha, d_model 512, 8 heads, head_dim 64, RoPE (half), causal.
LayerSpec DefaultCompareBase();

struct CompareVariant {
  std::string label;  // "MHA", "GQA-4", "MQA", "MLA-256", "SW-512"
  LayerSpec spec;
  bool pooled_from_base = false;  // convert_from the base's seed weights.
  bool has_base_weights = false;  // Shares MHA's weights (MHA itself, pooled forms, SW).
};

// The variants above for `options`; INVALID_ARGUMENT when the base is not an MHA spec.
absl::StatusOr<std::vector<CompareVariant>> CompareVariants(const CompareOptions& options);

struct Quantiles {
  double p50 = 0;
  double p90 = 0;
};

struct LengthMeasurement {
  int64_t length = 0;
  int64_t kv_bytes_formula = 0;  // batch x tokens held (min(L, window)) x kv bytes per token.
  int64_t kv_bytes_server = 0;   // What GetSession reports the batch holds after prefill.
  Quantiles prefill_ms;          // Server compute time of one Forward of the whole batch.
  Quantiles prefill_client_ms;   // Client wall time of that call.
  Quantiles decode_ms;           // Server compute time of one Decode call (one step, all requests).
  Quantiles decode_client_ms;
  std::optional<double> relative_l2;  // vs MHA; only for variants with MHA's weights.
  std::optional<double> cosine;
};

struct VariantMeasurement {
  CompareVariant variant;
  int64_t parameters = 0;
  int64_t parameter_bytes = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t page_bytes = 0;
  // Non-empty when the server's backend does not serve the variant (Configure UNIMPLEMENTED, e.g.
  // MLA on the CUDA backend): the reason, and no lengths. Any other error ends the comparison.
  std::string unavailable;
  std::vector<LengthMeasurement> lengths;
};

struct Comparison {
  CompareOptions options;
  std::string server_backend;
  std::string server_device;
  std::vector<VariantMeasurement> variants;
};

// Runs the comparison against `client`'s server; the first RPC error ends it (sessions it made are
// released). Progress goes to stderr.
absl::StatusOr<Comparison> RunComparison(const Client& client, const CompareOptions& options);

nlohmann::json ComparisonJson(const Comparison& comparison);
std::string ComparisonCsv(const Comparison& comparison);
std::string ComparisonTable(const Comparison& comparison);  // Markdown tables.

// Nearest-rank quantile of unsorted `values` (0 when empty).
double NearestRankQuantile(std::vector<double> values, double q);

// CompareOptions from attnctl's flags (--base --lengths --batch --repeats --decode_steps
// --mla_latent --window --kv_dtype --seed --csv --plot ...); `json` is attnctl's --json.
absl::StatusOr<CompareOptions> CompareOptionsFromFlags(bool json);

// `attnctl compare`: runs, prints in the chosen format, draws the plot. Returns the exit code.
int RunCompare(const Client& client, const CompareOptions& options);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNCTL_COMPARE_H_

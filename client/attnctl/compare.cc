#include "client/attnctl/compare.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <utility>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/common/forward_call.h"
#include "client/common/status_names.h"
#include "kernels/spec/layer_spec_json.h"
#include "kernels/kv/quantization.h"
#include "proto/codec/kv_quantization_codec.h"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"

// Defined in attnctl.cc, shared with its other commands.
ABSL_DECLARE_FLAG(int, batch);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(int, window);
ABSL_DECLARE_FLAG(std::string, kv_dtype);
ABSL_DECLARE_FLAG(std::string, kv_quant);

ABSL_FLAG(std::string, base, "",
          "compare: JSON spec of the MHA layer to compare from (default: d_model 512, 8 heads of "
          "64, RoPE, causal).");
ABSL_FLAG(std::string, lengths, "128,256,512,1024,2048",
          "compare: prompt lengths, comma separated.");
ABSL_FLAG(int, repeats, 5, "compare: measured prefill+decode rounds per variant and length.");
ABSL_FLAG(int, decode_steps, 8, "compare: decode calls after each prefill.");
ABSL_FLAG(int, mla_latent, 256, "compare: kv_lora_rank of the MLA variant.");
ABSL_FLAG(bool, csv, false, "compare: print CSV, one row per variant and length.");
ABSL_FLAG(std::string, plot, "",
          "compare: draw memory and latency vs length to this PNG "
          "(client/python/plot_compare.py, matplotlib).");
ABSL_FLAG(std::string, save_json, "",
          "compare: also write the --json output to this file (one run, table and data).");
ABSL_FLAG(std::string, plot_python, ATTNSERVE_DEFAULT_PYTHON,
          "compare: Python with matplotlib for --plot (deploy/setup.sh's .venv).");
ABSL_FLAG(std::string, plot_script, ATTNSERVE_PLOT_SCRIPT, "compare: the plotting script.");

namespace attnserve {

namespace {

// "f32", "bf16", "fp8_e4m3" or "int8": the KV format the sessions are configured with.
std::string KvFormatText(const CompareOptions& options) {
  return KvCacheFormatName(options.kv_dtype, options.kv_quantization);
}

// Inputs depend on (seed, length, repeat, what) only, so every variant sees the same ones.
std::mt19937_64 InputRng(uint64_t seed, int64_t length, int repeat, uint64_t what) {
  std::seed_seq sequence{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                         static_cast<uint32_t>(length), static_cast<uint32_t>(repeat),
                         static_cast<uint32_t>(what)};
  return std::mt19937_64(sequence);
}

absl::Status RpcError(absl::string_view what, const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, " failed: ", GrpcStatusString(status)));
}

int WindowOf(const CompareOptions& options) {
  if (options.window > 0) return options.window;
  const int64_t longest = *std::max_element(options.lengths.begin(), options.lengths.end());
  return static_cast<int>(std::max<int64_t>(1, longest / 4));
}

struct Agreement {
  double relative_l2 = 0;
  double cosine = 0;
};

Agreement Compare(const std::vector<float>& out, const std::vector<float>& reference) {
  double dot = 0, out_norm = 0, ref_norm = 0, diff_norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double a = out[i], b = reference[i];
    dot += a * b;
    out_norm += a * a;
    ref_norm += b * b;
    diff_norm += (a - b) * (a - b);
  }
  return {std::sqrt(diff_norm / ref_norm), dot / std::sqrt(out_norm * ref_norm)};
}

// One configured variant on the server; released when this goes away.
class RemoteSession {
 public:
  RemoteSession(const Client& client, std::string id) : client_(client), id_(std::move(id)) {}
  ~RemoteSession() {
    (void)CallRelease(client_, id_);
  }
  const std::string& id() const { return id_; }

 private:
  const Client& client_;
  std::string id_;
};

struct Timed {
  double compute_ms = 0;
  double client_ms = 0;
};

// Measures one variant. `reference` holds MHA's outputs per length (filled when `variant` is the
// base itself, read otherwise).
absl::Status MeasureVariant(const Client& client, const CompareOptions& options,
                            VariantMeasurement& measurement,
                            std::map<int64_t, std::vector<float>>& reference) {
  const CompareVariant& variant = measurement.variant;
  const int64_t longest = *std::max_element(options.lengths.begin(), options.lengths.end());
  v1::ConfigureRequest configure;
  *configure.mutable_spec() = LayerSpecToProto(variant.spec);
  if (variant.pooled_from_base) {
    configure.mutable_weights()->mutable_convert_from()->set_seed(options.seed);
  } else {
    configure.mutable_weights()->set_seed(options.seed);
  }
  SetKvCacheFormat(options.kv_dtype, options.kv_quantization, &configure);
  configure.set_max_requests(options.batch);
  configure.set_max_sequence_length(longest + options.decode_steps);
  configure.set_label(absl::StrCat("attnctl compare ", variant.label));
  v1::ConfigureResponse configured;
  {
    grpc::ClientContext context;
    client.Prepare(&context);
    grpc::Status status = client.stub->Configure(&context, configure, &configured);
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      measurement.unavailable = GrpcStatusString(status);
      return absl::OkStatus();
    }
    if (!status.ok()) return RpcError(absl::StrCat("Configure ", variant.label), status);
  }
  RemoteSession session(client, configured.session_id());
  measurement.parameters = configured.cost().parameter_count();
  measurement.parameter_bytes = configured.cost().parameter_bytes();
  measurement.kv_bytes_per_token = configured.cost().kv_bytes_per_token();
  measurement.page_bytes = configured.cost().page_bytes();
  const int64_t d_model = variant.spec.d_model;
  const bool is_reference = variant.label == "MHA";

  for (int64_t length : options.lengths) {
    LengthMeasurement at;
    at.length = length;
    const int64_t held = variant.spec.sliding_window > 0
                             ? std::min<int64_t>(length, variant.spec.sliding_window)
                             : length;
    at.kv_bytes_formula = options.batch * held * measurement.kv_bytes_per_token;
    std::vector<Timed> prefills, decodes;
    std::vector<float> outputs;  // Repeat 0: every prefill row, then every decode row.
    for (int repeat = 0; repeat < options.repeats; ++repeat) {
      if (isatty(STDERR_FILENO)) {  // Progress for a person watching; logs stay clean.
        std::fprintf(stderr, "compare: %-8s length %-5lld repeat %d/%d\r", variant.label.c_str(),
                     static_cast<long long>(length), repeat + 1, options.repeats);
      }
      std::vector<std::string> ids;
      for (int b = 0; b < options.batch; ++b)
        ids.push_back(absl::StrCat("L", length, "r", repeat, "b", b));
      std::mt19937_64 prefill_rng = InputRng(options.seed, length, repeat, 1);
      v1::ForwardRequest forward;
      forward.set_session_id(session.id());
      for (const std::string& id : ids) {
        v1::ForwardItem* item = forward.add_items();
        item->set_request_id(id);
        TensorToProto(RandomHidden(prefill_rng, length, d_model, DType::kF32),
                      item->mutable_hidden());
      }
      v1::ForwardResponse forwarded;
      {
        grpc::ClientContext context;
        client.Prepare(&context);
        const absl::Time start = absl::Now();
        grpc::Status status = CallForward(client, &context, forward, &forwarded);
        if (!status.ok()) return RpcError(absl::StrCat("Forward ", variant.label), status);
        prefills.push_back({NanosToMillis(forwarded.timing().compute_ns()),
                            absl::ToDoubleMilliseconds(absl::Now() - start)});
      }
      if (repeat == 0) {
        for (const v1::ForwardResult& result : forwarded.results()) {
          absl::StatusOr<Tensor> out = TensorFromProto(result.output());
          if (!out.ok()) return out.status();
          const std::vector<float> values = out->ToFloats();
          outputs.insert(outputs.end(), values.begin(), values.end());
        }
      }
      if (repeat == 0) {
        v1::GetSessionResponse got;
        grpc::Status status = CallGetSession(client, session.id(), &got);
        if (!status.ok()) return RpcError("GetSession", status);
        for (const v1::RequestInfo& request : got.session().requests()) {
          at.kv_bytes_server += request.kv_bytes();
        }
      }
      std::mt19937_64 decode_rng = InputRng(options.seed, length, repeat, 2);
      for (int step = 0; step < options.decode_steps; ++step) {
        v1::DecodeRequest decode;
        decode.set_session_id(session.id());
        for (const std::string& id : ids) AddRandomDecodeItem(&decode, id, decode_rng, d_model);
        v1::DecodeResponse decoded;
        grpc::ClientContext context;
        client.Prepare(&context);
        const absl::Time start = absl::Now();
        grpc::Status status = client.stub->Decode(&context, decode, &decoded);
        if (!status.ok()) return RpcError(absl::StrCat("Decode ", variant.label), status);
        decodes.push_back({NanosToMillis(decoded.timing().compute_ns()),
                           absl::ToDoubleMilliseconds(absl::Now() - start)});
        if (repeat != 0) continue;
        for (const v1::DecodeResult& result : decoded.results()) {
          absl::StatusOr<Tensor> out = TensorFromProto(result.output());
          if (!out.ok()) return out.status();
          const std::vector<float> values = out->ToFloats();
          outputs.insert(outputs.end(), values.begin(), values.end());
        }
      }
      for (const std::string& id : ids) {
        grpc::Status status = CallRelease(client, session.id(), id);
        if (!status.ok()) return RpcError("Release", status);
      }
    }
    const auto quantiles = [](const std::vector<Timed>& timed, double Timed::*field) {
      std::vector<double> values;
      for (const Timed& t : timed) values.push_back(t.*field);
      return Quantiles{NearestRankQuantile(values, 0.5), NearestRankQuantile(values, 0.9)};
    };
    at.prefill_ms = quantiles(prefills, &Timed::compute_ms);
    at.prefill_client_ms = quantiles(prefills, &Timed::client_ms);
    at.decode_ms = quantiles(decodes, &Timed::compute_ms);
    at.decode_client_ms = quantiles(decodes, &Timed::client_ms);
    if (is_reference) reference[length] = outputs;
    if (variant.has_base_weights && reference.contains(length)) {
      const std::vector<float>& want = reference.at(length);
      if (want.size() != outputs.size()) {
        return absl::InternalError(absl::StrCat(variant.label, " returned ", outputs.size(),
                                                " output values at length ", length, ", MHA ",
                                                want.size()));
      }
      const Agreement agreement = Compare(outputs, want);
      at.relative_l2 = agreement.relative_l2;
      at.cosine = agreement.cosine;
    }
    measurement.lengths.push_back(at);
  }
  return absl::OkStatus();
}

nlohmann::json OptionalJson(const std::optional<double>& value) {
  return value.has_value() ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

nlohmann::json QuantilesJson(const Quantiles& q) { return {{"p50", q.p50}, {"p90", q.p90}}; }

std::string Mib(int64_t bytes) { return absl::StrFormat("%.3f", bytes / 1048576.0); }

std::string WeightsText(const CompareVariant& variant, uint64_t seed) {
  if (variant.pooled_from_base) return absl::StrCat("MHA seed ", seed, ", K/V heads mean-pooled");
  if (variant.has_base_weights) return absl::StrCat("MHA seed ", seed);
  return absl::StrCat("own, seed ", seed);
}

}  // namespace

LayerSpec DefaultCompareBase() {
  LayerSpec base;
  base.variant = AttentionVariant::kMHA;
  base.d_model = 512;
  base.num_heads = 8;
  base.num_kv_heads = 8;
  base.head_dim = 64;
  base.rope = RopeLayout::kHalf;
  base.causal = true;
  return base;
}

absl::StatusOr<std::vector<CompareVariant>> CompareVariants(const CompareOptions& options) {
  const LayerSpec& base = options.base;
  if (base.variant != AttentionVariant::kMHA || base.sliding_window != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--base must be an mha spec without a sliding window (the other forms are "
                     "derived from it), not ",
                     LayerSpecSummary(base)));
  }
  if (absl::Status s = ValidateLayerSpec(base); !s.ok()) return s;
  std::vector<CompareVariant> variants;
  variants.push_back({"MHA", base, false, true});
  std::vector<int> kv_counts;
  for (int divisor : {2, 4}) {
    const int count = base.num_heads / divisor;
    if (base.num_heads % divisor == 0 && count > 1) kv_counts.push_back(count);
  }
  kv_counts.push_back(1);
  for (int count : kv_counts) {
    if (!variants.empty() && variants.back().spec.num_kv_heads == count) continue;
    LayerSpec pooled = base;
    pooled.num_kv_heads = count;
    pooled.variant = count == 1 ? AttentionVariant::kMQA : AttentionVariant::kGQA;
    variants.push_back(
        {count == 1 ? std::string("MQA") : absl::StrCat("GQA-", count), pooled, true, true});
  }
  LayerSpec mla = base;
  mla.variant = AttentionVariant::kMLA;
  mla.num_kv_heads = 0;
  mla.head_dim = 0;
  mla.rope = base.rope == RopeLayout::kNone ? RopeLayout::kNone : RopeLayout::kInterleaved;
  mla.mla.q_lora_rank = 0;
  mla.mla.kv_lora_rank = options.mla_latent;
  mla.mla.qk_nope_head_dim = base.head_dim;
  mla.mla.qk_rope_head_dim = std::max(2, base.head_dim / 2);
  mla.mla.v_head_dim = base.head_dim;
  if (absl::Status s = ValidateLayerSpec(mla); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the MLA form: ", s.message()));
  }
  variants.push_back({absl::StrCat("MLA-", options.mla_latent), mla, false, false});
  LayerSpec window = base;
  window.sliding_window = WindowOf(options);
  variants.push_back({absl::StrCat("SW-", window.sliding_window), window, false, true});
  return variants;
}

double NearestRankQuantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

absl::StatusOr<Comparison> RunComparison(const Client& client, const CompareOptions& options) {
  if (options.lengths.empty() || options.batch < 1 || options.repeats < 1 ||
      options.decode_steps < 0) {
    return absl::InvalidArgumentError(
        "compare needs --lengths, --batch >= 1, --repeats >= 1 and --decode_steps >= 0");
  }
  absl::StatusOr<std::vector<CompareVariant>> variants = CompareVariants(options);
  if (!variants.ok()) return variants.status();
  Comparison comparison;
  comparison.options = options;
  {
    v1::GetServerInfoResponse info;
    grpc::ClientContext context;
    client.Prepare(&context);
    grpc::Status status = client.stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    if (!status.ok()) return RpcError("GetServerInfo", status);
    comparison.server_backend = info.backend();
    comparison.server_device = info.device();
  }
  std::map<int64_t, std::vector<float>> reference;  // MHA is first, so this is filled first.
  for (const CompareVariant& variant : *variants) {
    VariantMeasurement measurement;
    measurement.variant = variant;
    if (absl::Status s = MeasureVariant(client, options, measurement, reference); !s.ok()) {
      return s;
    }
    comparison.variants.push_back(std::move(measurement));
  }
  if (isatty(STDERR_FILENO)) std::fprintf(stderr, "%-60s\r", "");
  return comparison;
}

nlohmann::json ComparisonJson(const Comparison& comparison) {
  const CompareOptions& options = comparison.options;
  nlohmann::json variants = nlohmann::json::array();
  for (const VariantMeasurement& v : comparison.variants) {
    nlohmann::json lengths = nlohmann::json::array();
    for (const LengthMeasurement& at : v.lengths) {
      lengths.push_back({{"length", at.length},
                         {"kv_bytes_formula", at.kv_bytes_formula},
                         {"kv_bytes_server", at.kv_bytes_server},
                         {"prefill_ms", QuantilesJson(at.prefill_ms)},
                         {"prefill_client_ms", QuantilesJson(at.prefill_client_ms)},
                         {"decode_ms", QuantilesJson(at.decode_ms)},
                         {"decode_client_ms", QuantilesJson(at.decode_client_ms)},
                         {"relative_l2", OptionalJson(at.relative_l2)},
                         {"cosine", OptionalJson(at.cosine)}});
    }
    variants.push_back({{"label", v.variant.label},
                        {"spec", nlohmann::json::parse(LayerSpecToJson(v.variant.spec))},
                        {"weights", WeightsText(v.variant, options.seed)},
                        {"pooled_from_mha", v.variant.pooled_from_base},
                        {"parameters", v.parameters},
                        {"parameter_bytes", v.parameter_bytes},
                        {"kv_bytes_per_token", v.kv_bytes_per_token},
                        {"page_bytes", v.page_bytes},
                        {"unavailable", v.unavailable},
                        {"lengths", lengths}});
  }
  return {
      {"server", {{"backend", comparison.server_backend}, {"device", comparison.server_device}}},
      {"batch", options.batch},
      {"repeats", options.repeats},
      {"decode_steps", options.decode_steps},
      {"seed", options.seed},
      {"kv_dtype", std::string(DTypeName(options.kv_dtype))},
      {"kv_format", KvFormatText(options)},
      {"lengths", options.lengths},
      {"variants", variants}};
}

std::string ComparisonCsv(const Comparison& comparison) {
  std::string out =
      "variant,length,parameters,kv_bytes_per_token,kv_bytes_formula,kv_bytes_server,"
      "prefill_p50_ms,prefill_p90_ms,decode_p50_ms,decode_p90_ms,prefill_client_p50_ms,"
      "decode_client_p50_ms,relative_l2,cosine\n";
  const auto optional = [](const std::optional<double>& value) {
    return value.has_value() ? absl::StrFormat("%.9g", *value) : std::string();
  };
  for (const VariantMeasurement& v : comparison.variants) {
    for (const LengthMeasurement& at : v.lengths) {
      absl::StrAppendFormat(&out, "%s,%d,%d,%d,%d,%d,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%s,%s\n",
                            v.variant.label, at.length, v.parameters, v.kv_bytes_per_token,
                            at.kv_bytes_formula, at.kv_bytes_server, at.prefill_ms.p50,
                            at.prefill_ms.p90, at.decode_ms.p50, at.decode_ms.p90,
                            at.prefill_client_ms.p50, at.decode_client_ms.p50,
                            optional(at.relative_l2), optional(at.cosine));
    }
  }
  return out;
}

std::string ComparisonTable(const Comparison& comparison) {
  const CompareOptions& options = comparison.options;
  std::string out = absl::StrFormat(
      "Server: %s (%s). Batch %d, KV %s, %d repeats, %d decode steps each; latencies are the "
      "server's compute time (p50 / p90, ms).\n\n",
      comparison.server_backend, comparison.server_device, options.batch,
      KvFormatText(options), options.repeats, options.decode_steps);
  // The last column is what fp8/int8 pages would take (same size; scales included, default page
  // size), computed from the spec: --kv_quant measures them.
  out +=
      "| variant | weights | parameters | KV bytes/token | fp8/int8 KV bytes/token |\n"
      "|---|---|---:|---:|---:|\n";
  for (const VariantMeasurement& v : comparison.variants) {
    if (!v.unavailable.empty()) {
      absl::StrAppendFormat(&out, "| %s | not served by this server: %s | | | |\n",
                            v.variant.label, v.unavailable);
      continue;
    }
    const int64_t quantized_bytes =
        KvBytesPerTokenOf(v.variant.spec, KvStorageFormat::Quantized(KvQuantization::kInt8),
                          DefaultPageSize(v.variant.spec));
    absl::StrAppendFormat(&out, "| %s | %s | %d | %d | %d |\n", v.variant.label,
                          WeightsText(v.variant, options.seed), v.parameters, v.kv_bytes_per_token,
                          quantized_bytes);
  }
  // One table per quantity: rows are lengths, columns variants.
  const auto table = [&](absl::string_view title, auto cell) {
    absl::StrAppend(&out, "\n", title, "\n\n| length |");
    for (const VariantMeasurement& v : comparison.variants)
      absl::StrAppend(&out, " ", v.variant.label, " |");
    absl::StrAppend(&out, "\n|---:|");
    for (size_t i = 0; i < comparison.variants.size(); ++i) absl::StrAppend(&out, "---:|");
    absl::StrAppend(&out, "\n");
    for (size_t row = 0; row < options.lengths.size(); ++row) {
      absl::StrAppend(&out, "| ", options.lengths[row], " |");
      for (const VariantMeasurement& v : comparison.variants) {
        absl::StrAppend(&out, " ", row < v.lengths.size() ? cell(v.lengths[row]) : "n/a", " |");
      }
      absl::StrAppend(&out, "\n");
    }
  };
  table("KV cache held by the batch after prefill, MiB (server, whole pages; formula in --json)",
        [](const LengthMeasurement& at) { return Mib(at.kv_bytes_server); });
  table("Prefill of the batch, ms (p50 / p90)", [](const LengthMeasurement& at) {
    return absl::StrFormat("%.2f / %.2f", at.prefill_ms.p50, at.prefill_ms.p90);
  });
  table("Decode step of the batch, ms (p50 / p90)", [](const LengthMeasurement& at) {
    return absl::StrFormat("%.3f / %.3f", at.decode_ms.p50, at.decode_ms.p90);
  });
  table("Output vs MHA: relative L2 error / cosine (same weights and inputs; - = own weights)",
        [](const LengthMeasurement& at) {
          return at.relative_l2.has_value()
                     ? absl::StrFormat("%.4f / %.5f", *at.relative_l2, *at.cosine)
                     : std::string("-");
        });
  return out;
}

absl::StatusOr<CompareOptions> CompareOptionsFromFlags(bool json) {
  CompareOptions options;
  options.base = DefaultCompareBase();
  if (const std::string path = absl::GetFlag(FLAGS_base); !path.empty()) {
    std::ifstream file(path);
    if (!file) return absl::NotFoundError(absl::StrCat("--base: cannot open ", path));
    const std::string text((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
    absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(text);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--base ", path, ": ", spec.status().message()));
    }
    options.base = *spec;
  }
  options.lengths.clear();
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_lengths), ',', absl::SkipEmpty())) {
    int64_t length = 0;
    if (!absl::SimpleAtoi(text, &length) || length < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lengths: '", text, "' is not a positive integer"));
    }
    options.lengths.push_back(length);
  }
  options.batch = absl::GetFlag(FLAGS_batch);
  options.repeats = absl::GetFlag(FLAGS_repeats);
  options.decode_steps = absl::GetFlag(FLAGS_decode_steps);
  options.mla_latent = absl::GetFlag(FLAGS_mla_latent);
  options.window = absl::GetFlag(FLAGS_window);
  options.seed = absl::GetFlag(FLAGS_seed);
  absl::StatusOr<DType> kv_dtype = ParseDType(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok())
    return absl::InvalidArgumentError(absl::StrCat("--kv_dtype: ", kv_dtype.status().message()));
  options.kv_dtype = *kv_dtype;
  absl::StatusOr<KvQuantization> kv_quant = ParseKvQuantization(absl::GetFlag(FLAGS_kv_quant));
  if (!kv_quant.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_quant: ", kv_quant.status().message()));
  }
  options.kv_quantization = *kv_quant;
  if (json && absl::GetFlag(FLAGS_csv)) {
    return absl::InvalidArgumentError("--json and --csv exclude each other");
  }
  options.format = json                       ? CompareOptions::Format::kJson
                   : absl::GetFlag(FLAGS_csv) ? CompareOptions::Format::kCsv
                                              : CompareOptions::Format::kTable;
  options.plot_path = absl::GetFlag(FLAGS_plot);
  options.save_json_path = absl::GetFlag(FLAGS_save_json);
  options.plot_python = absl::GetFlag(FLAGS_plot_python);
  options.plot_script = absl::GetFlag(FLAGS_plot_script);
  return options;
}

namespace {

// Runs `python script json_path --out png` and waits; its own output passes through.
absl::Status DrawPlot(const CompareOptions& options, const nlohmann::json& json) {
  char json_path[] = "/tmp/attnctl-compare-XXXXXX";
  const int fd = mkstemp(json_path);
  if (fd < 0) return absl::InternalError("--plot: cannot create a temporary file");
  const std::string text = json.dump();
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!written) {
    unlink(json_path);
    return absl::InternalError("--plot: cannot write the temporary JSON file");
  }
  std::vector<std::string> args = {options.plot_python, options.plot_script, json_path, "--out",
                                   options.plot_path};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  int status = 0;
  if (spawned == 0) waitpid(pid, &status, 0);
  unlink(json_path);
  if (spawned != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--plot: cannot run ", options.plot_python,
                     " (set --plot_python to a Python with "
                     "matplotlib; deploy/setup.sh makes one in .venv)"));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("--plot: ", options.plot_python, " ",
                                            options.plot_script, " failed (exit status ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : -1, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

int RunCompare(const Client& client, const CompareOptions& options) {
  absl::StatusOr<Comparison> comparison = RunComparison(client, options);
  if (!comparison.ok()) {
    const bool usage = comparison.status().code() == absl::StatusCode::kInvalidArgument &&
                       !absl::StrContains(comparison.status().message(), "failed:");
    return ReportError(comparison.status().ToString(), usage ? kExitUsage : kExitRpcError);
  }
  const nlohmann::json json = ComparisonJson(*comparison);
  switch (options.format) {
    case CompareOptions::Format::kJson:
      std::printf("%s\n", json.dump(2).c_str());
      break;
    case CompareOptions::Format::kCsv:
      std::printf("%s", ComparisonCsv(*comparison).c_str());
      break;
    case CompareOptions::Format::kTable:
      std::printf("%s", ComparisonTable(*comparison).c_str());
      break;
  }
  std::fflush(stdout);
  if (!options.save_json_path.empty()) {
    std::ofstream file(options.save_json_path);
    file << json.dump(2) << "\n";
    if (!file.flush()) {
      return ReportError(absl::StrCat("--save_json: cannot write ", options.save_json_path),
                         kExitRpcError);
    }
  }
  if (!options.plot_path.empty()) {
    if (absl::Status s = DrawPlot(options, json); !s.ok())
      return ReportError(s.message(), kExitRpcError);
  }
  return kExitOk;
}

}  // namespace attnserve

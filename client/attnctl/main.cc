// attnctl: a command-line client of attnserve's AttentionService.
//
//   attnctl [--server=HOST:PORT] [--json] [--timeout_s=S] <command> [flags]
//
// Commands:
//   configure  create a session: spec flags (--variant --d_model --num_heads --num_kv_heads
//              --head_dim --rope --causal --window ...) or --spec_file=spec.json, and over either
//              (or alone) --spec=KEY=VALUE,... for any spec field (spec_settings.h); weights from
//              --seed or --checkpoint=PATH --layer=N (a file on the server's side); --kv_dtype,
//              --page_size, --max_requests, --max_seq_len, --label; a hybrid stack with
//              --stack=sw:4096x5,global (over the spec flags) or --num_layers=N (--checkpoint);
//              --per_layer makes the stack a model session (one layer per call; with
//              --checkpoint alone and no --num_layers, every layer from --layer on)
//   forward    prefill --session --request=ID[,ID...]: --tokens=N random rows (--seed), or
//              --input=x.npy (float32/float16 [T, d_model]) or --input=x.safetensors --tensor=NAME;
//              --dtype sets the wire dtype; --positions=5,8,... or --positions_tensor=NAME;
//              --output=out.npy saves the first request's output; --layer=K runs layer K of a
//              model session (a step is layers 0, 1, ..., n-1 in order, layer 0 starts it)
//   decode     --session --request=ID[,ID...] --steps=N: one random hidden row per request and
//              step, by unary Decode calls or, with --stream, over one DecodeStream; --position=P
//              puts the first step at RoPE position P (then P+1, ...); --layer=K as forward
//              (one layer per step: --steps=1, then the next layer)
//   info       GetServerInfo
//   list       ListSessions
//   get        GetSession --session
//   release    Release --session [--request]
//   fork       Fork --session --request --forks=ID[,ID...]: requests sharing --request's cached
//              tokens (prefix sharing)
//   move       a request from --server to --to (ExportRequest -> ImportRequest): --session
//              --request [--to_session --new_request --release_source] (client/attnctl/move.h)
//   health     grpc.health.v1 Check [--service]; --wait_s=S retries until SERVING
//   demo       configure each demo variant, forward, decode, release; print the per-variant table
//   compare    the variant comparison (docs/comparison.md) measured on the server
//              (client/attnctl/compare.h)
//   convert    MHA -> GQA/MQA by mean-pooling K/V heads, to a safetensors file (offline;
//              client/attnctl/convert.h)
//
// Output is human-readable unless --json. Errors print the gRPC status code name and message;
// the exit code is 0 on success, 1 for an RPC error, 2 for bad flags or input files.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/common/client.h"
#include "client/common/forward_call.h"
#include "client/attnctl/compare.h"
#include "client/common/status_names.h"
#include "client/attnctl/demo.h"
#include "client/attnctl/convert.h"
#include "client/attnctl/move.h"
#include "client/attnctl/npy.h"
#include "client/attnctl/spec_settings.h"
#include "client/common/session_routing.h"
#include "client/attnctl/stack_pattern.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/base/clip_for_message.h"
#include "kernels/base/command_line_usage.h"
#include "kernels/kv/quantization.h"
#include "kernels/spec/layer_spec_json.h"
#include "kernels/stack/layer_stack.h"
#include "kernels/model/safetensors.h"
#include "nlohmann/json.hpp"
#include "proto/codec/kv_quantization_codec.h"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"

// Connection and output.
ABSL_FLAG(std::string, server, "127.0.0.1:50051", "Server address, HOST:PORT.");
ABSL_FLAG(bool, json, false, "Print machine-readable JSON instead of text.");
ABSL_FLAG(double, timeout_s, 60, "Deadline of each call, seconds (a whole stream for --stream).");

// configure: the layer spec.
ABSL_FLAG(std::string, spec_file, "",
          "configure: a JSON layer spec (kernels/spec/layer_spec_json.h); "
          "replaces the spec flags.");
ABSL_FLAG(std::vector<std::string>, spec, {},
          "configure: spec fields as KEY=VALUE, comma separated, by their JSON names (every field "
          "of the spec; `attnctl --help` lists them), over the other spec flags or --spec_file, or "
          "alone the whole spec: --spec=variant=gqa,d_model=512,num_heads=8,num_kv_heads=2,"
          "alibi=bloom,rope_scaling.type=linear,rope_scaling.factor=2.");
ABSL_FLAG(std::string, variant, "", "configure: mha, mqa, gqa or mla.");
ABSL_FLAG(int, d_model, 0, "configure: hidden size (required); demo: default 512.");
ABSL_FLAG(int, num_heads, 0, "configure: query heads (required); demo: default 8.");
ABSL_FLAG(int, num_kv_heads, 0, "configure: KV heads (mha: = num_heads, mqa: 1, gqa: required).");
ABSL_FLAG(int, head_dim, 0, "configure: per-head width (0 = d_model / num_heads).");
ABSL_FLAG(bool, qkv_bias, false, "configure: bias on q/k/v projections.");
ABSL_FLAG(bool, o_bias, false, "configure: bias on the output projection.");
ABSL_FLAG(std::string, rope, "half", "configure: RoPE layout: none, half or interleaved.");
ABSL_FLAG(double, rope_theta, 10000.0, "configure: RoPE base.");
ABSL_FLAG(bool, causal, true, "configure: causal mask.");
ABSL_FLAG(int, window, 0, "configure/demo: sliding window in tokens (0 = full attention).");
ABSL_FLAG(double, softmax_scale, 0.0, "configure: scale of q.k (0 = 1/sqrt(qk head dim)).");
ABSL_FLAG(int, q_lora_rank, 0, "configure (mla): low-rank query width (0 = plain q_proj).");
ABSL_FLAG(int, kv_lora_rank, 0, "configure (mla): latent width (required for mla).");
ABSL_FLAG(int, qk_nope_head_dim, 0, "configure (mla): per-head q/k width without RoPE.");
ABSL_FLAG(int, qk_rope_head_dim, 0, "configure (mla): decoupled RoPE width.");
ABSL_FLAG(int, v_head_dim, 0, "configure (mla): per-head value width.");
ABSL_FLAG(int, rotary_dim, 0, "configure: rotated dims per q/k head (0 = the whole head).");
ABSL_FLAG(std::string, qk_norm, "none",
          "configure: q/k norm by name: none, rms (Qwen3), ... (`attnctl --help` lists every "
          "name under the spec keys).");
ABSL_FLAG(double, qk_norm_eps, 1e-6, "configure: epsilon of the q/k norm.");
ABSL_FLAG(double, attn_logit_softcapping, 0.0,
          "configure: scores = cap * tanh(scores / cap) (Gemma 2: 50; 0 = none).");
ABSL_FLAG(bool, attention_sinks, false, "configure: learned per-head sinks (gpt-oss).");
// configure: weights and KV cache.
ABSL_FLAG(uint64_t, seed, 1, "configure: weight seed; forward/decode/demo: input seed.");
ABSL_FLAG(std::string, checkpoint, "",
          "configure: safetensors file or directory on the server; alone (no --variant or "
          "--spec_file), the spec comes from its config.json.");
ABSL_FLAG(int, layer, 0,
          "configure: layer index in --checkpoint (a stack's first layer); forward/decode: the "
          "layer of a model session (--per_layer) this call runs, 0 .. num_layers-1.");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "configure/demo: KV cache dtype: f32 or bf16 (the CPU backend); f32, f16 or bf16 (the "
          "CUDA backend). `attnctl info` lists what the server's backend stores.");
ABSL_FLAG(std::string, kv_quant, "none",
          "configure/demo/compare: 8-bit KV pages with per-page scales: none, fp8 (e4m3) or "
          "int8 (CPU backend); when set, --kv_dtype is not sent.");
ABSL_FLAG(int, page_size, 0, "configure: tokens per KV page (0 = server default).");
ABSL_FLAG(int, max_requests, 0, "configure: requests in the session (0 = server limit).");
ABSL_FLAG(int64_t, max_seq_len, 0, "configure: tokens per request (0 = server limit).");
ABSL_FLAG(std::string, label, "", "configure: free text shown by list.");
ABSL_FLAG(std::string, stack, "",
          "configure: a hybrid stack over the spec flags, bottom first, e.g. sw:4096x5,global "
          "(5 sliding-window layers of 4096 tokens, then 1 global; docs/hybrid_stacks.md).");
ABSL_FLAG(int, num_layers, 0,
          "configure: with --checkpoint alone, a stack of this many layers from --layer on, each "
          "spec read from config.json.");
ABSL_FLAG(bool, per_layer, false,
          "configure: a model session (StackSpec.per_layer) of --stack's or --num_layers' layers, "
          "or with --checkpoint alone every layer from --layer on: each forward/decode runs the "
          "one layer --layer names (docs/remote_model.md).");

// forward / decode / get / release.
ABSL_FLAG(std::string, session, "", "Session id (from configure).");
ABSL_FLAG(std::string, request, "",
          "forward/decode: request ids, comma separated; "
          "release: one request (empty = the whole session); fork: the request forked.");
ABSL_FLAG(std::string, forks, "",
          "fork: ids of the new requests, comma separated (distinct, not yet in the session).");
ABSL_FLAG(int, tokens, 0,
          "forward: random prompt rows per request, >= 1 (0 = 16); demo: >= 1 (0 = 128).");
ABSL_FLAG(std::string, input, "",
          "forward: .npy (float32/float16) or .safetensors hidden states "
          "[T, d_model], sent for every listed request.");
ABSL_FLAG(std::string, tensor, "", "forward: tensor name in a .safetensors --input.");
ABSL_FLAG(std::string, dtype, "",
          "forward/decode: wire dtype of the inputs (default: f32 for "
          "random inputs, the file's dtype for files).");
ABSL_FLAG(std::string, positions, "",
          "forward: RoPE positions, comma separated, one per token "
          "(default: continue from the request's length).");
ABSL_FLAG(std::string, positions_tensor, "",
          "forward: read the positions from this tensor of the "
          ".safetensors --input (any float or integer-valued dtype).");
ABSL_FLAG(std::string, output, "", "forward: write the first request's output to this .npy.");
ABSL_FLAG(int, steps, 0, "decode: steps (default 1); demo: default 16.");
ABSL_FLAG(bool, stream, false, "decode: use one DecodeStream instead of unary Decode calls.");
ABSL_FLAG(int64_t, position, -1,
          "decode: RoPE position of the first step, each later step one more (-1 = the "
          "request's length), e.g. to continue a request prefilled with --positions.");
ABSL_FLAG(int, batch, 4, "demo: requests per variant.");

// health.
ABSL_FLAG(std::string, service, "", "health: service name (empty = the whole server).");
ABSL_FLAG(double, wait_s, 0, "health: keep checking until SERVING for up to this many seconds.");

namespace attnserve {
namespace {

using google::protobuf::util::JsonPrintOptions;

std::string ProtoJson(const google::protobuf::Message& message) {
  JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::vector<std::string> RequestIds() {
  std::vector<std::string> ids;
  for (absl::string_view id :
       absl::StrSplit(absl::GetFlag(FLAGS_request), ',', absl::SkipEmpty())) {
    ids.emplace_back(id);
  }
  return ids;
}

std::string Mib(int64_t bytes) { return absl::StrFormat("%.2f MiB", bytes / 1048576.0); }

std::string TimingText(const v1::Timing& timing) {
  return absl::StrFormat("queue %.3f ms, compute %.3f ms, total %.3f ms",
                         NanosToMillis(timing.queue_ns()), NanosToMillis(timing.compute_ns()),
                         NanosToMillis(timing.total_ns()));
}

nlohmann::json TimingJson(const v1::Timing& timing) {
  return {{"queue_ns", timing.queue_ns()},
          {"compute_ns", timing.compute_ns()},
          {"total_ns", timing.total_ns()}};
}

std::string DTypeText(v1::DType dtype) {
  absl::StatusOr<DType> parsed = DTypeFromProto(dtype);
  return parsed.ok() ? std::string(DTypeName(*parsed)) : "unspecified";
}

// A session's KV format: its 8-bit quantization when set, else its dtype.
std::string KvFormatText(const v1::SessionInfo& session) {
  absl::StatusOr<KvQuantization> quantization =
      KvQuantizationFromProto(session.kv_cache_quantization());
  if (quantization.ok() && *quantization != KvQuantization::kNone) {
    return std::string(KvQuantizationName(*quantization));
  }
  return DTypeText(session.kv_cache_dtype());
}

// ---- configure ----------------------------------------------------------------------------------

absl::StatusOr<LayerSpec> SpecFromFlags() {
  const std::vector<std::string> settings = absl::GetFlag(FLAGS_spec);
  const std::string spec_file = absl::GetFlag(FLAGS_spec_file);
  if (!spec_file.empty()) {
    std::ifstream file(spec_file);
    if (!file) return absl::NotFoundError(absl::StrCat("--spec_file: cannot open ", spec_file));
    const std::string text((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
    absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(text);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(spec_file, ": ", spec.status().message()));
    }
    return settings.empty() ? spec : ApplySpecSettings(*spec, settings);
  }
  if (absl::GetFlag(FLAGS_variant).empty()) {
    if (!settings.empty()) return ApplySpecSettings(std::nullopt, settings);
    return absl::InvalidArgumentError(
        "configure needs --variant (mha, mqa, gqa, mla), --spec_file, --spec, or --checkpoint "
        "alone (the spec then comes from the checkpoint's config.json)");
  }
  LayerSpec spec;
  absl::StatusOr<AttentionVariant> variant = ParseVariant(absl::GetFlag(FLAGS_variant));
  if (!variant.ok()) return variant.status();
  spec.variant = *variant;
  spec.d_model = absl::GetFlag(FLAGS_d_model);
  spec.num_heads = absl::GetFlag(FLAGS_num_heads);
  if (spec.d_model <= 0 || spec.num_heads <= 0) {
    return absl::InvalidArgumentError("configure needs --d_model and --num_heads (> 0)");
  }
  spec.num_kv_heads = absl::GetFlag(FLAGS_num_kv_heads);
  if (spec.num_kv_heads == 0) {
    if (spec.variant == AttentionVariant::kMHA) spec.num_kv_heads = spec.num_heads;
    if (spec.variant == AttentionVariant::kMQA) spec.num_kv_heads = 1;
  }
  spec.head_dim = absl::GetFlag(FLAGS_head_dim);
  if (spec.head_dim == 0 && spec.variant != AttentionVariant::kMLA) {
    spec.head_dim = spec.d_model / spec.num_heads;
  }
  spec.qkv_bias = absl::GetFlag(FLAGS_qkv_bias);
  spec.o_bias = absl::GetFlag(FLAGS_o_bias);
  absl::StatusOr<RopeLayout> rope = ParseRopeLayout(absl::GetFlag(FLAGS_rope));
  if (!rope.ok()) return rope.status();
  spec.rope = *rope;
  spec.rope_theta = absl::GetFlag(FLAGS_rope_theta);
  spec.causal = absl::GetFlag(FLAGS_causal);
  spec.sliding_window = absl::GetFlag(FLAGS_window);
  spec.softmax_scale = static_cast<float>(absl::GetFlag(FLAGS_softmax_scale));
  if (spec.variant == AttentionVariant::kMLA) {
    spec.num_kv_heads = 0;
    spec.mla.q_lora_rank = absl::GetFlag(FLAGS_q_lora_rank);
    spec.mla.kv_lora_rank = absl::GetFlag(FLAGS_kv_lora_rank);
    spec.mla.qk_nope_head_dim = absl::GetFlag(FLAGS_qk_nope_head_dim);
    spec.mla.qk_rope_head_dim = absl::GetFlag(FLAGS_qk_rope_head_dim);
    spec.mla.v_head_dim = absl::GetFlag(FLAGS_v_head_dim);
  }
  spec.rotary_dim = absl::GetFlag(FLAGS_rotary_dim);
  absl::StatusOr<QkNorm> qk_norm = ParseQkNorm(absl::GetFlag(FLAGS_qk_norm));
  if (!qk_norm.ok()) return qk_norm.status();
  spec.qk_norm = *qk_norm;
  spec.qk_norm_eps = static_cast<float>(absl::GetFlag(FLAGS_qk_norm_eps));
  spec.attn_logit_softcapping = static_cast<float>(absl::GetFlag(FLAGS_attn_logit_softcapping));
  spec.attention_sinks = absl::GetFlag(FLAGS_attention_sinks);
  // --spec may set what these flags leave invalid (num_kv_heads for gqa); its result is validated.
  if (!settings.empty()) return ApplySpecSettings(spec, settings);
  // The server validates too; checking here gives the same message without a round trip.
  if (absl::Status status = ValidateLayerSpec(spec); !status.ok()) return status;
  return spec;
}

int Configure(const Client& client) {
  // --checkpoint without --variant or --spec_file: the server reads the spec from config.json.
  const bool spec_from_checkpoint = absl::GetFlag(FLAGS_variant).empty() &&
                                    absl::GetFlag(FLAGS_spec_file).empty() &&
                                    absl::GetFlag(FLAGS_spec).empty() &&
                                    !absl::GetFlag(FLAGS_checkpoint).empty();
  absl::StatusOr<LayerSpec> spec = spec_from_checkpoint ? LayerSpec() : SpecFromFlags();
  if (!spec.ok()) return ReportError(spec.status().message());
  absl::StatusOr<DType> kv_dtype = ParseDType(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return ReportError(absl::StrCat("--kv_dtype: ", kv_dtype.status().message()));
  absl::StatusOr<KvQuantization> kv_quant = ParseKvQuantization(absl::GetFlag(FLAGS_kv_quant));
  if (!kv_quant.ok()) return ReportError(absl::StrCat("--kv_quant: ", kv_quant.status().message()));

  v1::ConfigureRequest request;
  if (const std::string pattern = absl::GetFlag(FLAGS_stack); !pattern.empty()) {
    if (spec_from_checkpoint) {
      return ReportError(
          "--stack needs the spec flags (or --spec_file, --spec); with --checkpoint "
          "alone, use --num_layers");
    }
    absl::StatusOr<std::vector<LayerSpec>> layers = ExpandStackPattern(*spec, pattern);
    if (!layers.ok()) return ReportError(layers.status().message());
    for (const LayerSpec& layer : *layers) {
      *request.mutable_stack()->add_layers() = LayerSpecToProto(layer);
    }
  } else if (absl::GetFlag(FLAGS_num_layers) > 0) {
    if (!spec_from_checkpoint) return ReportError("--num_layers needs --checkpoint alone");
    request.mutable_stack()->set_num_layers(absl::GetFlag(FLAGS_num_layers));
  } else if (!spec_from_checkpoint) {
    if (absl::GetFlag(FLAGS_per_layer)) {
      return ReportError(
          "--per_layer needs a stack: --stack over the spec flags, or --checkpoint alone (with "
          "--num_layers, or every layer from --layer on)");
    }
    *request.mutable_spec() = LayerSpecToProto(*spec);
  }
  // A model session: with --checkpoint alone and no --num_layers, the stack's 0 layers mean every
  // layer of config.json from --layer on.
  if (absl::GetFlag(FLAGS_per_layer)) request.mutable_stack()->set_per_layer(true);
  if (const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint); !checkpoint.empty()) {
    request.mutable_weights()->mutable_checkpoint()->set_path(checkpoint);
    request.mutable_weights()->mutable_checkpoint()->set_layer_index(absl::GetFlag(FLAGS_layer));
  } else {
    request.mutable_weights()->set_seed(absl::GetFlag(FLAGS_seed));
  }
  SetKvCacheFormat(*kv_dtype, *kv_quant, &request);
  request.set_page_size(absl::GetFlag(FLAGS_page_size));
  request.set_max_requests(absl::GetFlag(FLAGS_max_requests));
  request.set_max_sequence_length(absl::GetFlag(FLAGS_max_seq_len));
  request.set_label(absl::GetFlag(FLAGS_label));

  v1::ConfigureResponse response;
  grpc::ClientContext context;
  client.Prepare(&context);
  grpc::Status status = client.stub->Configure(&context, request, &response);
  if (!status.ok()) return ReportRpcError("Configure", status);
  if (client.json) {
    std::printf("%s", ProtoJson(response).c_str());
    return kExitOk;
  }
  const v1::SessionCost& cost = response.cost();
  absl::PrintF("session      %s\n", response.session_id());
  absl::PrintF("replica      %s\n", response.replica());
  absl::StatusOr<LayerSpec> configured = LayerSpecFromProto(response.spec());
  absl::PrintF("spec         %s%s\n", LayerSpecSummary(configured.ok() ? *configured : *spec),
               spec_from_checkpoint ? " (from config.json)" : "");
  if (response.stack_size() > 0) {
    // Runs of one kind, bottom first: "sliding_window:1024 x5, global x1".
    std::vector<std::pair<std::string, int>> runs;
    for (const v1::LayerSpec& layer : response.stack()) {
      absl::StatusOr<LayerSpec> parsed = LayerSpecFromProto(layer);
      const std::string kind = parsed.ok() ? LayerKind(*parsed) : "?";
      if (runs.empty() || runs.back().first != kind) runs.emplace_back(kind, 0);
      ++runs.back().second;
    }
    std::vector<std::string> parts;
    for (const auto& [kind, count] : runs) parts.push_back(absl::StrCat(kind, " x", count));
    absl::PrintF("stack        %d layers: %s\n", response.stack_size(), absl::StrJoin(parts, ", "));
  }
  absl::PrintF("parameters   %d (%s)\n", cost.parameter_count(), Mib(cost.parameter_bytes()));
  const KvStorageFormat kv_format =
      *kv_quant != KvQuantization::kNone ? KvStorageFormat::Quantized(*kv_quant) : *kv_dtype;
  absl::PrintF("KV cache     %s, %d bytes/token, page %d bytes\n", KvStorageFormatName(kv_format),
               cost.kv_bytes_per_token(), cost.page_bytes());
  absl::PrintF("max context  %d tokens (free pool now)\n", cost.max_context_tokens());
  absl::PrintF("server time  %s\n", TimingText(response.timing()));
  return kExitOk;
}

// ---- forward / decode ---------------------------------------------------------------------------

// The session's layer spec, for d_model.
absl::StatusOr<v1::SessionInfo> FetchSession(const Client& client, const std::string& session,
                                             grpc::Status* rpc_status) {
  v1::GetSessionResponse response;
  *rpc_status = CallGetSession(client, session, &response);
  if (!rpc_status->ok()) return absl::UnknownError("GetSession failed");
  return response.session();
}

// Reports FetchSession's failure for `command`: a session that does not exist is said to be so
// (the user named it; "GetSession failed" named a call they never made).
int ReportSessionLookupError(const Client& client, absl::string_view command,
                             const std::string& session, const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::NOT_FOUND) {
    return ReportRpcError("GetSession", status);
  }
  return ReportError(
      absl::StrCat(command, " failed: NOT_FOUND: session '", ClipForMessage(session),
                   "' does not exist on ", client.target, " (never created, released, or expired)"),
      kExitRpcError);
}

// --tokens: 0 takes the command's default; a negative count is a typo, not a default.
absl::StatusOr<int> TokensFlag(int default_tokens) {
  const int tokens = absl::GetFlag(FLAGS_tokens);
  if (tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens = ", tokens, ": must be >= 1 (0 = the default, ", default_tokens,
                     ")"));
  }
  return tokens == 0 ? default_tokens : tokens;
}

absl::StatusOr<Tensor> InputFromFile(const std::string& path) {
  if (absl::EndsWith(path, ".npy")) return ReadNpy(path);
  if (absl::EndsWith(path, ".safetensors")) {
    const std::string name = absl::GetFlag(FLAGS_tensor);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    if (!file.ok()) return file.status();
    if (name.empty()) {
      std::vector<std::string> names = file->names();
      if (names.size() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(path, " holds ", names.size(),
                                                       " tensors; choose one with --tensor (",
                                                       absl::StrJoin(names, ", "), ")"));
      }
      return file->Read(names.front());
    }
    return file->Read(name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--input=", path, ": expected a .npy or .safetensors file"));
}

absl::StatusOr<std::vector<int64_t>> PositionsFromFlags() {
  std::vector<int64_t> positions;
  if (const std::string name = absl::GetFlag(FLAGS_positions_tensor); !name.empty()) {
    const std::string path = absl::GetFlag(FLAGS_input);
    if (!absl::EndsWith(path, ".safetensors")) {
      return absl::InvalidArgumentError("--positions_tensor needs a .safetensors --input");
    }
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
    if (!file.ok()) return file.status();
    absl::StatusOr<Tensor> tensor = file->Read(name);
    if (!tensor.ok()) return tensor.status();
    for (float value : tensor->ToFloats()) {
      if (value != std::floor(value) || value < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--positions_tensor ", name, ": ", value, " is not a position"));
      }
      positions.push_back(static_cast<int64_t>(value));
    }
    return positions;
  }
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_positions), ',', absl::SkipWhitespace())) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(part, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--positions: '", part, "' is not an integer"));
    }
    positions.push_back(value);
  }
  return positions;
}

int Forward(const Client& client) {
  const std::string session = absl::GetFlag(FLAGS_session);
  const std::vector<std::string> ids = RequestIds();
  if (session.empty() || ids.empty()) return ReportError("forward needs --session and --request");
  grpc::Status rpc_status;
  absl::StatusOr<int> tokens = TokensFlag(16);
  if (!tokens.ok()) return ReportError(tokens.status().message());
  absl::StatusOr<v1::SessionInfo> info = FetchSession(client, session, &rpc_status);
  if (!info.ok()) return ReportSessionLookupError(client, "forward", session, rpc_status);
  const int64_t d_model = info->spec().d_model();

  const std::string dtype_flag = absl::GetFlag(FLAGS_dtype);
  std::optional<DType> wire_dtype;
  if (!dtype_flag.empty()) {
    absl::StatusOr<DType> parsed = ParseDType(dtype_flag);
    if (!parsed.ok()) return ReportError(absl::StrCat("--dtype: ", parsed.status().message()));
    wire_dtype = *parsed;
  }
  std::optional<Tensor> file_input;
  if (const std::string path = absl::GetFlag(FLAGS_input); !path.empty()) {
    absl::StatusOr<Tensor> loaded = InputFromFile(path);
    if (!loaded.ok()) return ReportError(loaded.status().message());
    Tensor tensor = *std::move(loaded);
    if (tensor.rank() == 1) {  // One token.
      Tensor row(tensor.dtype(), {1, tensor.dim(0)});
      std::memcpy(row.data(), tensor.data(), tensor.num_bytes());
      tensor = std::move(row);
    }
    if (tensor.rank() != 2 || tensor.dim(1) != d_model) {
      return ReportError(absl::StrCat("--input ", path, " is ", tensor.DebugString(),
                                      "; the session needs [tokens, ", d_model, "]"));
    }
    if (wire_dtype && *wire_dtype != tensor.dtype()) tensor = tensor.CastTo(*wire_dtype);
    file_input = std::move(tensor);
  }
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  absl::StatusOr<std::vector<int64_t>> positions = PositionsFromFlags();
  if (!positions.ok()) return ReportError(positions.status().message());

  v1::ForwardRequest request;
  request.set_session_id(session);
  request.set_layer(absl::GetFlag(FLAGS_layer));
  for (const std::string& id : ids) {
    v1::ForwardItem* item = request.add_items();
    item->set_request_id(id);
    TensorToProto(file_input
                      ? *file_input
                      : RandomHidden(rng, *tokens, d_model, wire_dtype.value_or(DType::kF32)),
                  item->mutable_hidden());
    item->mutable_positions()->Add(positions->begin(), positions->end());
  }
  v1::ForwardResponse response;
  grpc::ClientContext context;
  client.Prepare(&context);
  const absl::Time start = absl::Now();
  grpc::Status status = CallForward(client, &context, request, &response);
  const double client_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!status.ok()) return ReportRpcError("Forward", status);

  nlohmann::json results = nlohmann::json::array();
  for (const v1::ForwardResult& result : response.results()) {
    absl::StatusOr<Tensor> output = TensorFromProto(result.output());
    if (!output.ok()) {
      return ReportError(absl::StrCat("Forward returned a malformed output for ",
                                      result.request_id(), ": ", output.status().message()),
                         kExitRpcError);
    }
    if (const std::string path = absl::GetFlag(FLAGS_output);
        !path.empty() && &result == &response.results(0)) {
      if (absl::Status written = WriteNpy(path, *output); !written.ok()) {
        return ReportError(written.message());
      }
    }
    if (client.json) {
      results.push_back({{"request_id", result.request_id()},
                         {"shape", output->shape()},
                         {"dtype", std::string(DTypeName(output->dtype()))},
                         {"sequence_length", result.sequence_length()},
                         {"rms", Rms(*output)}});
    } else {
      absl::PrintF("%-12s output %-16s sequence_length %-6d rms %.6f\n", result.request_id(),
                   output->DebugString(), result.sequence_length(), Rms(*output));
    }
  }
  if (client.json) {
    nlohmann::json out = {
        {"results", results}, {"timing", TimingJson(response.timing())}, {"client_ms", client_ms}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    absl::PrintF("client %.3f ms; server %s\n", client_ms, TimingText(response.timing()));
  }
  return kExitOk;
}

int Decode(const Client& client) {
  const std::string session = absl::GetFlag(FLAGS_session);
  const std::vector<std::string> ids = RequestIds();
  if (session.empty() || ids.empty()) return ReportError("decode needs --session and --request");
  const int steps = absl::GetFlag(FLAGS_steps) > 0 ? absl::GetFlag(FLAGS_steps) : 1;
  grpc::Status rpc_status;
  absl::StatusOr<v1::SessionInfo> info = FetchSession(client, session, &rpc_status);
  if (!info.ok()) return ReportSessionLookupError(client, "decode", session, rpc_status);
  const int64_t d_model = info->spec().d_model();
  DType wire_dtype = DType::kF32;
  if (const std::string flag = absl::GetFlag(FLAGS_dtype); !flag.empty()) {
    absl::StatusOr<DType> parsed = ParseDType(flag);
    if (!parsed.ok()) return ReportError(absl::StrCat("--dtype: ", parsed.status().message()));
    wire_dtype = *parsed;
  }
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  const int64_t position = absl::GetFlag(FLAGS_position);
  if (position < -1) return ReportError("--position must be >= 0 (or -1: the request's length)");
  auto make_step = [&](int step) {
    v1::DecodeRequest request;
    request.set_session_id(session);
    request.set_layer(absl::GetFlag(FLAGS_layer));
    for (const std::string& id : ids) {
      v1::DecodeItem* item = AddRandomDecodeItem(&request, id, rng, d_model, wire_dtype);
      if (position >= 0) item->set_position(position + step - 1);
    }
    return request;
  };

  const bool stream = absl::GetFlag(FLAGS_stream);
  nlohmann::json step_json = nlohmann::json::array();
  double total_client_ms = 0;
  int64_t total_compute_ns = 0;
  // Prints (or records) one answered step; false when the answer is malformed.
  auto report_step = [&](int step, const v1::DecodeResponse& response, double client_ms) {
    total_client_ms += client_ms;
    total_compute_ns += response.timing().compute_ns();
    nlohmann::json results = nlohmann::json::array();
    std::string text;
    for (const v1::DecodeResult& result : response.results()) {
      absl::StatusOr<Tensor> output = TensorFromProto(result.output());
      if (!output.ok()) {
        ReportError(absl::StrCat("step ", step, ": malformed output for ", result.request_id(),
                                 ": ", output.status().message()),
                    kExitRpcError);
        return false;
      }
      results.push_back({{"request_id", result.request_id()},
                         {"shape", output->shape()},
                         {"sequence_length", result.sequence_length()},
                         {"rms", Rms(*output)}});
      absl::StrAppendFormat(&text, " %s:len=%d,rms=%.4f", result.request_id(),
                            result.sequence_length(), Rms(*output));
    }
    if (client.json) {
      step_json.push_back({{"step", step},
                           {"results", results},
                           {"timing", TimingJson(response.timing())},
                           {"client_ms", client_ms}});
    } else {
      absl::PrintF("step %-4d client %8.3f ms  server compute %8.3f ms %s\n", step, client_ms,
                   NanosToMillis(response.timing().compute_ns()), text);
    }
    return true;
  };

  if (!stream) {
    for (int step = 1; step <= steps; ++step) {
      const v1::DecodeRequest request = make_step(step);
      v1::DecodeResponse response;
      grpc::ClientContext context;
      client.Prepare(&context);
      const absl::Time start = absl::Now();
      grpc::Status status = client.stub->Decode(&context, request, &response);
      const double client_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (!status.ok()) return ReportRpcError(absl::StrCat("Decode (step ", step, ")"), status);
      if (!report_step(step, response, client_ms)) return kExitRpcError;
    }
  } else {
    grpc::ClientContext context;
    client.Prepare(&context);
    AddSessionMetadata(&context, session);  // A stream's metadata leaves before its messages.
    std::unique_ptr<grpc::ClientReaderWriter<v1::DecodeRequest, v1::DecodeResponse>> call =
        client.stub->DecodeStream(&context);
    // Autoregressive use: send a step, wait for its answer, then send the next.
    for (int step = 1; step <= steps; ++step) {
      const v1::DecodeRequest request = make_step(step);
      const absl::Time start = absl::Now();
      v1::DecodeResponse response;
      if (!call->Write(request) || !call->Read(&response)) {
        grpc::Status status = call->Finish();
        if (status.ok()) {
          status = grpc::Status(grpc::StatusCode::UNKNOWN,
                                absl::StrCat("the stream ended after ", step - 1, " steps"));
        }
        return ReportRpcError(absl::StrCat("DecodeStream (step ", step, ")"), status);
      }
      const double client_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (!report_step(step, response, client_ms)) return kExitRpcError;
    }
    call->WritesDone();
    grpc::Status status = call->Finish();
    if (!status.ok()) return ReportRpcError("DecodeStream", status);
  }
  if (client.json) {
    nlohmann::json out = {{"stream", stream},
                          {"steps", step_json},
                          {"client_ms_per_step", total_client_ms / steps},
                          {"compute_ms_per_step", NanosToMillis(total_compute_ns) / steps}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    absl::PrintF("%d steps%s: client %.3f ms/step, server compute %.3f ms/step\n", steps,
                 stream ? " (stream)" : "", total_client_ms / steps,
                 NanosToMillis(total_compute_ns) / steps);
  }
  return kExitOk;
}

// ---- info / list / get / release / health
// ---------------------------------------------------------

// Proto enum names without their prefix, lower case, comma-separated: "mha, mqa, gqa".
template <typename Values, typename NameFn>
std::string EnumNames(const Values& values, NameFn name, absl::string_view prefix) {
  std::vector<std::string> names;
  for (int value : values) {
    std::string n = name(value);
    if (absl::StartsWith(n, prefix)) n = n.substr(prefix.size());
    names.push_back(absl::AsciiStrToLower(n));
  }
  return names.empty() ? "-" : absl::StrJoin(names, ", ");
}

// The serving backend's capability table (kernels/capabilities.h), as GetServerInfo reports it.
void PrintCapabilities(const v1::BackendCapabilities& c) {
  const auto variant = [](int v) { return v1::Variant_Name(static_cast<v1::Variant>(v)); };
  const auto dtype = [](int v) { return v1::DType_Name(static_cast<v1::DType>(v)); };
  const auto scaling = [](int v) {
    return v1::RopeScalingType_Name(static_cast<v1::RopeScalingType>(v));
  };
  absl::PrintF("serves       %s; head dims %s\n", EnumNames(c.variants(), variant, "VARIANT_"),
               c.head_dims().empty() ? "any" : absl::StrJoin(c.head_dims(), ", "));
  absl::PrintF("             KV %s; compute %s; RoPE scaling %s\n",
               c.kv_formats().empty() ? "-" : absl::StrJoin(c.kv_formats(), ", "),
               EnumNames(c.compute_dtypes(), dtype, "DTYPE_"),
               EnumNames(c.rope_scalings(), scaling, "ROPE_SCALING_"));
  absl::PrintF("             variations %s\n",
               c.variations().empty() ? "-" : absl::StrJoin(c.variations(), ", "));
  const std::pair<const char*, bool> features[] = {
      {"yarn_attention_factor", c.yarn_attention_factor()},
      {"fork", c.fork()},
      {"export_import", c.export_import()},
      {"stacks", c.stacks()},
  };
  std::vector<std::string> yes, no;
  for (const auto& [name, served] : features) (served ? yes : no).push_back(name);
  absl::PrintF("             yes: %s\n", yes.empty() ? "-" : absl::StrJoin(yes, ", "));
  absl::PrintF("             no: %s\n", no.empty() ? "-" : absl::StrJoin(no, ", "));
}

int Info(const Client& client) {
  v1::GetServerInfoResponse response;
  grpc::ClientContext context;
  client.Prepare(&context);
  grpc::Status status = client.stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  if (!status.ok()) return ReportRpcError("GetServerInfo", status);
  if (client.json) {
    std::printf("%s", ProtoJson(response).c_str());
    return kExitOk;
  }
  const v1::Limits& limits = response.limits();
  absl::PrintF("version      %s\n", response.version());
  absl::PrintF("replica      %s\n", response.replica());
  absl::PrintF("backend      %s (%s)\n", response.backend(), response.device());
  absl::PrintF("KV pool      %s used of %s\n", Mib(response.kv_pool_used_bytes()),
               Mib(response.kv_pool_capacity_bytes()));
  absl::PrintF("sessions     %d, requests %d\n", response.sessions(), response.requests());
  absl::PrintF("limits       %d sessions, %d requests/session, %d tokens/request, %s/message\n",
               limits.max_sessions(), limits.max_requests_per_session(),
               limits.max_sequence_length(), Mib(limits.max_message_bytes()));
  absl::PrintF("TTLs         request %.1f s, session %.1f s\n", limits.request_ttl_ns() / 1e9,
               limits.session_ttl_ns() / 1e9);
  if (response.has_capabilities()) PrintCapabilities(response.capabilities());
  return kExitOk;
}

std::string SessionLine(const v1::SessionInfo& session) {
  absl::StatusOr<LayerSpec> spec = LayerSpecFromProto(session.spec());
  return absl::StrFormat("%s  %-8s  KV %s %-11s idle %6.1f s  %s%s", session.session_id(),
                         spec.ok() ? std::string(VariantName(spec->variant)) : "?",
                         KvFormatText(session), Mib(session.kv_bytes_used()),
                         session.idle_ns() / 1e9,
                         spec.ok() ? LayerSpecSummary(*spec) : "(spec not readable)",
                         session.label().empty() ? "" : absl::StrCat("  [", session.label(), "]"));
}

int List(const Client& client) {
  v1::ListSessionsResponse response;
  grpc::ClientContext context;
  client.Prepare(&context);
  grpc::Status status = client.stub->ListSessions(&context, v1::ListSessionsRequest(), &response);
  if (!status.ok()) return ReportRpcError("ListSessions", status);
  if (client.json) {
    std::printf("%s", ProtoJson(response).c_str());
    return kExitOk;
  }
  if (response.sessions().empty()) absl::PrintF("no sessions\n");
  for (const v1::SessionInfo& session : response.sessions()) {
    absl::PrintF("%s\n", SessionLine(session));
  }
  return kExitOk;
}

int Get(const Client& client) {
  const std::string session = absl::GetFlag(FLAGS_session);
  if (session.empty()) return ReportError("get needs --session");
  v1::GetSessionResponse response;
  grpc::Status status = CallGetSession(client, session, &response);
  if (!status.ok()) return ReportRpcError("GetSession", status);
  if (client.json) {
    std::printf("%s", ProtoJson(response).c_str());
    return kExitOk;
  }
  const v1::SessionInfo& info = response.session();
  absl::PrintF("%s\n", SessionLine(info));
  absl::PrintF("page %d tokens; parameters %d; KV %d bytes/token\n", info.page_size(),
               info.cost().parameter_count(), info.cost().kv_bytes_per_token());
  if (info.num_layers() > 1) {
    absl::PrintF("%s of %d layers, KV by kind:\n",
                 info.per_layer() ? "model session (one layer per call: --layer)" : "stack",
                 info.num_layers());
  }
  for (const v1::LayerKindKv& kind : info.kv_by_layer_kind()) {
    absl::PrintF("  %-24s %3d layers  KV %s (%d bytes)\n", kind.kind(), kind.layers(),
                 Mib(kind.kv_bytes()), kind.kv_bytes());
  }
  for (const v1::RequestInfo& request_info : info.requests()) {
    // A model session's request mid-step names the layer its step runs next.
    const std::string step = request_info.next_layer() > 0
                                 ? absl::StrCat("  next layer ", request_info.next_layer())
                                 : "";
    absl::PrintF("  request %-16s length %-8d KV %-12s idle %.1f s%s\n", request_info.request_id(),
                 request_info.sequence_length(), Mib(request_info.kv_bytes()),
                 request_info.idle_ns() / 1e9, step);
  }
  return kExitOk;
}

// Fork: new requests continuing from --request's cached tokens (prefix sharing: full pages shared,
// the partial last page copied).
int Fork(const Client& client) {
  const std::string session = absl::GetFlag(FLAGS_session);
  const std::string source = absl::GetFlag(FLAGS_request);
  if (session.empty() || source.empty() || absl::GetFlag(FLAGS_forks).empty()) {
    return ReportError("fork needs --session, --request and --forks=ID[,ID...]");
  }
  v1::ForkRequest request;
  request.set_session_id(session);
  request.set_request_id(source);
  for (absl::string_view id :
       absl::StrSplit(absl::GetFlag(FLAGS_forks), ',', absl::SkipWhitespace())) {
    request.add_new_request_ids(std::string(id));
  }
  v1::ForkResponse response;
  grpc::ClientContext context;
  client.Prepare(&context);
  grpc::Status status = client.stub->Fork(&context, request, &response);
  if (!status.ok()) return ReportRpcError("Fork", status);
  if (client.json) {
    std::printf("%s", ProtoJson(response).c_str());
    return kExitOk;
  }
  for (const v1::ForkResult& result : response.results()) {
    absl::PrintF("forked %s from %s: %d tokens\n", result.request_id(), source,
                 result.sequence_length());
  }
  absl::PrintF("KV added: %s (copies of the partial last page; full pages shared)\n",
               Mib(response.kv_bytes_added()));
  return kExitOk;
}

int Release(const Client& client) {
  const std::string session = absl::GetFlag(FLAGS_session);
  if (session.empty()) return ReportError("release needs --session");
  const std::string request_id = absl::GetFlag(FLAGS_request);
  v1::ReleaseResponse response;
  grpc::Status status = CallRelease(client, session, request_id, &response);
  if (!status.ok()) return ReportRpcError("Release", status);
  if (client.json) {
    std::printf("%s", ProtoJson(response).c_str());
  } else {
    absl::PrintF("released %s%s: freed %s\n", request_id.empty() ? "session " : "request ",
                 request_id.empty() ? session : request_id, Mib(response.freed_bytes()));
  }
  return kExitOk;
}

int Health(const Client& client) {
  const std::string service = absl::GetFlag(FLAGS_service);
  const absl::Time give_up = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_wait_s));
  std::string serving;
  grpc::Status status;
  while (true) {
    Client attempt = client;
    // While waiting, each attempt gets a short deadline so that retries stay frequent.
    if (absl::GetFlag(FLAGS_wait_s) > 0) attempt.timeout = absl::Seconds(1);
    status = CheckHealth(attempt, service, &serving);
    if ((status.ok() && serving == "SERVING") || absl::Now() >= give_up) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!status.ok()) return ReportRpcError("Health.Check", status);
  if (client.json) {
    std::printf("%s\n", nlohmann::json({{"service", service}, {"status", serving}}).dump().c_str());
  } else {
    absl::PrintF("%s\n", serving);
  }
  return serving == "SERVING" ? kExitOk : kExitRpcError;
}

int Demo(const Client& client) {
  DemoOptions options;
  if (absl::GetFlag(FLAGS_d_model) > 0) options.d_model = absl::GetFlag(FLAGS_d_model);
  if (absl::GetFlag(FLAGS_num_heads) > 0) options.num_heads = absl::GetFlag(FLAGS_num_heads);
  absl::StatusOr<int> tokens = TokensFlag(options.tokens);
  if (!tokens.ok()) return ReportError(tokens.status().message());
  options.tokens = *tokens;
  if (absl::GetFlag(FLAGS_steps) > 0) options.steps = absl::GetFlag(FLAGS_steps);
  options.window = absl::GetFlag(FLAGS_window);
  options.batch = absl::GetFlag(FLAGS_batch);
  options.seed = absl::GetFlag(FLAGS_seed);
  if (options.batch < 1) return ReportError("--batch must be >= 1");
  absl::StatusOr<DType> kv_dtype = ParseDType(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return ReportError(absl::StrCat("--kv_dtype: ", kv_dtype.status().message()));
  options.kv_dtype = *kv_dtype;
  absl::StatusOr<KvQuantization> kv_quant = ParseKvQuantization(absl::GetFlag(FLAGS_kv_quant));
  if (!kv_quant.ok()) return ReportError(absl::StrCat("--kv_quant: ", kv_quant.status().message()));
  options.kv_quantization = *kv_quant;
  return RunDemo(client, options);
}

constexpr char kUsage[] =
    "attnctl [--server=HOST:PORT] [--json] <command> [flags]\n"
    "commands: configure, forward, decode, info, list, get, release, fork, move, health,\n"
    "          demo, compare, convert\n"
    "  attnctl configure --variant=gqa --d_model=512 --num_heads=8 --num_kv_heads=2 --seed=1\n"
    "  attnctl configure --spec_file=gqa.json --spec=qk_norm=rms,rope_scaling.type=linear,"
    "rope_scaling.factor=2\n"
    "  attnctl forward --session=ID --request=a,b --tokens=128\n"
    "  attnctl decode --session=ID --request=a,b --steps=8 [--stream]\n"
    "  attnctl release --session=ID [--request=a]\n"
    "  attnctl fork --session=ID --request=a --forks=a1,a2\n"
    "  attnctl configure --checkpoint=DIR --per_layer   (a model session of every layer)\n"
    "  attnctl forward --session=ID --request=a --tokens=8 --layer=0   (then --layer=1, ...)\n"
    "  attnctl --server=A move --to=B --session=ID --request=a [--to_session=ID2]\n"
    "  attnctl demo\n"
    "  attnctl compare [--lengths=128,256,512,1024,2048 --batch=4 --repeats=5] [--csv] "
    "[--plot=out.png]\n"
    "  attnctl convert --from=mha.json --seed=1 --kv_heads=2 --out=gqa.safetensors\n"
    "A server with TLS / tokens: --tls_ca=CA.pem [--tls_cert=C.pem --tls_key=K.pem] --token=T\n"
    "(or ATTNSERVE_TLS_CA, ATTNSERVE_TOKEN in the environment).\n"
    "Run `attnctl --help` for attnctl's flags (`--helpfull`: every library's too).";

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  using namespace attnserve;
  // --help lists attnctl's flags and the TLS/token flags of client/common.
  // The spec keys --spec takes, from the spec's field table.
  const std::string usage =
      absl::StrCat(kUsage, "\n--spec keys (configure):\n", SpecSettingsHelp());
  SetCommandLineUsage("attnctl", usage, {"client/attnctl/", "client/common/"});
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() != 2) {
    std::fprintf(stderr, "%s\n", kUsage);
    return kExitUsage;
  }
  const std::string command = positional[1];
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s > 0)) return ReportError("--timeout_s must be > 0");
  absl::StatusOr<ChannelSecurity> security = ChannelSecurityFromFlags();
  if (!security.ok()) return ReportError(security.status().message());
  const Client client = MakeClient(absl::GetFlag(FLAGS_server), absl::Seconds(timeout_s),
                                   absl::GetFlag(FLAGS_json), *security);
  if (command == "configure") return Configure(client);
  if (command == "forward") return Forward(client);
  if (command == "decode") return Decode(client);
  if (command == "info") return Info(client);
  if (command == "list") return List(client);
  if (command == "get") return Get(client);
  if (command == "release") return Release(client);
  if (command == "fork") return Fork(client);
  if (command == "move") return RunMove(client, *security);
  if (command == "health") return Health(client);
  if (command == "demo") return Demo(client);
  if (command == "compare") {
    absl::StatusOr<CompareOptions> options = CompareOptionsFromFlags(absl::GetFlag(FLAGS_json));
    if (!options.ok()) return ReportError(options.status().message());
    return RunCompare(client, *options);
  }
  if (command == "convert") return RunConvert(absl::GetFlag(FLAGS_json));
  return ReportError(absl::StrCat("unknown command '", command, "'\n", kUsage));
}

#include "client/attnctl/demo.h"

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/common/forward_call.h"
#include "client/common/status_names.h"
#include "client/common/demo_variants.h"
#include "nlohmann/json.hpp"
#include "kernels/kv/quantization.h"
#include "proto/codec/kv_quantization_codec.h"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve {
namespace {

// "f32", "bf16", "fp8_e4m3" or "int8": the KV format the sessions are configured with.
std::string KvFormatText(const DemoOptions& options) {
  return KvCacheFormatName(options.kv_dtype, options.kv_quantization);
}

struct DemoRow {
  std::string label;
  std::string summary;
  int64_t parameters = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t kv_bytes_used = 0;     // The session's pages after prefill and decode (GetSession).
  double prefill_client_ms = 0;  // One Forward call for the whole batch, as the client saw it.
  double prefill_server_ms = 0;  // Its Timing.compute_ns.
  double decode_client_ms = 0;   // Per step (one Decode call for the whole batch).
  double decode_server_ms = 0;   // Per step, Timing.compute_ns.
  int64_t final_sequence_length = 0;
  std::string error;  // Set when the variant failed: "Configure: UNIMPLEMENTED: ...".
};

double MillisSince(absl::Time start) { return absl::ToDoubleMilliseconds(absl::Now() - start); }

// Runs one variant; on failure prints the error, records it in row->error and returns false.
// Releases the session it made whatever happens after Configure.
bool RunVariant(const Client& client, const DemoOptions& options, const NamedSpec& variant,
                DemoRow* row) {
  v1::ConfigureRequest configure;
  *configure.mutable_spec() = LayerSpecToProto(variant.spec);
  configure.mutable_weights()->set_seed(options.seed);
  SetKvCacheFormat(options.kv_dtype, options.kv_quantization, &configure);
  configure.set_label(absl::StrCat("attnctl demo ", variant.label));
  v1::ConfigureResponse configured;
  {
    grpc::ClientContext context;
    client.Prepare(&context);
    grpc::Status status = client.stub->Configure(&context, configure, &configured);
    if (!status.ok()) {
      ReportRpcError(absl::StrCat(variant.label, " Configure"), status);
      row->error = absl::StrCat("Configure: ", GrpcStatusString(status));
      return false;
    }
  }
  const std::string& session = configured.session_id();
  row->parameters = configured.cost().parameter_count();
  row->kv_bytes_per_token = configured.cost().kv_bytes_per_token();

  auto fail = [&](absl::string_view what, const grpc::Status& status) {
    ReportRpcError(absl::StrCat(variant.label, " ", what), status);
    row->error = absl::StrCat(what, ": ", GrpcStatusString(status));
    (void)CallRelease(client, session);
    return false;
  };

  std::mt19937_64 rng(options.seed);
  const int d_model = variant.spec.d_model;
  v1::ForwardRequest forward;
  forward.set_session_id(session);
  for (int b = 0; b < options.batch; ++b) {
    v1::ForwardItem* item = forward.add_items();
    item->set_request_id(absl::StrCat("r", b));
    TensorToProto(RandomHidden(rng, options.tokens, d_model, DType::kF32), item->mutable_hidden());
  }
  v1::ForwardResponse forwarded;
  {
    grpc::ClientContext context;
    client.Prepare(&context);
    const absl::Time start = absl::Now();
    grpc::Status status = CallForward(client, &context, forward, &forwarded);
    row->prefill_client_ms = MillisSince(start);
    if (!status.ok()) return fail("Forward", status);
  }
  row->prefill_server_ms = NanosToMillis(forwarded.timing().compute_ns());
  if (forwarded.results_size() != options.batch) {
    return fail("Forward", grpc::Status(grpc::StatusCode::INTERNAL,
                                        absl::StrCat("client check: ", forwarded.results_size(),
                                                     " results for ", options.batch, " requests")));
  }
  for (const v1::ForwardResult& result : forwarded.results()) {
    if (result.output().shape_size() != 2 || result.output().shape(0) != options.tokens ||
        result.output().shape(1) != d_model) {
      return fail("Forward",
                  grpc::Status(grpc::StatusCode::INTERNAL,
                               absl::StrCat("client check: output of ", result.request_id(),
                                            " has the wrong shape")));
    }
  }

  double decode_client_ms = 0;
  int64_t decode_server_ns = 0;
  for (int step = 0; step < options.steps; ++step) {
    v1::DecodeRequest decode;
    decode.set_session_id(session);
    for (int b = 0; b < options.batch; ++b) {
      AddRandomDecodeItem(&decode, absl::StrCat("r", b), rng, d_model);
    }
    v1::DecodeResponse decoded;
    grpc::ClientContext context;
    client.Prepare(&context);
    const absl::Time start = absl::Now();
    grpc::Status status = client.stub->Decode(&context, decode, &decoded);
    decode_client_ms += MillisSince(start);
    if (!status.ok()) return fail(absl::StrCat("Decode step ", step + 1), status);
    decode_server_ns += decoded.timing().compute_ns();
    if (decoded.results_size() > 0)
      row->final_sequence_length = decoded.results(0).sequence_length();
  }
  if (options.steps > 0) {
    row->decode_client_ms = decode_client_ms / options.steps;
    row->decode_server_ms = NanosToMillis(decode_server_ns) / options.steps;
  }

  v1::GetSessionResponse got;
  if (grpc::Status status = CallGetSession(client, session, &got); !status.ok()) {
    return fail("GetSession", status);
  }
  row->kv_bytes_used = got.session().kv_bytes_used();

  grpc::Status status = CallRelease(client, session);
  if (!status.ok()) {
    ReportRpcError(absl::StrCat(variant.label, " Release"), status);
    row->error = absl::StrCat("Release: ", GrpcStatusString(status));
    return false;
  }
  return true;
}

grpc::Status GetInfo(const Client& client, v1::GetServerInfoResponse* info) {
  grpc::ClientContext context;
  client.Prepare(&context);
  return client.stub->GetServerInfo(&context, v1::GetServerInfoRequest(), info);
}

}  // namespace

int RunDemo(const Client& client, const DemoOptions& options) {
  v1::GetServerInfoResponse before;
  if (grpc::Status status = GetInfo(client, &before); !status.ok()) {
    return ReportRpcError("GetServerInfo", status);
  }
  const std::vector<NamedSpec> variants =
      DemoVariants(options.d_model, options.num_heads, options.window);
  for (const NamedSpec& variant : variants) {
    if (absl::Status valid = ValidateLayerSpec(variant.spec); !valid.ok()) {
      return ReportError(absl::StrCat("demo variant ", variant.label, ": ", valid.message()));
    }
  }
  if (!client.json) {
    absl::PrintF("attnserve client demo — server %s: %s backend (%s), version %s\n", client.target,
                 before.backend(), before.device(), before.version());
    absl::PrintF(
        "KV pool %.1f MiB (%.1f MiB in use); per variant: %d requests x %d prompt "
        "tokens, then %d decode steps; KV cache %s; weights seed %d\n\n",
        before.kv_pool_capacity_bytes() / 1048576.0, before.kv_pool_used_bytes() / 1048576.0,
        options.batch, options.tokens, options.steps, KvFormatText(options), options.seed);
  }
  // A variant the server cannot run (a backend that refuses it, a pool too small) is reported and
  // the demo goes on with the next; the exit status says whether all of them ran.
  std::vector<DemoRow> rows, failed;
  for (const NamedSpec& variant : variants) {
    DemoRow row;
    row.label = variant.label;
    row.summary = LayerSpecSummary(variant.spec);
    if (RunVariant(client, options, variant, &row)) {
      rows.push_back(row);
    } else {
      failed.push_back(row);
    }
  }
  const int exit_code = failed.empty() ? kExitOk : kExitRpcError;
  v1::GetServerInfoResponse after;
  if (grpc::Status status = GetInfo(client, &after); !status.ok()) {
    return ReportRpcError("GetServerInfo", status);
  }

  if (client.json) {
    nlohmann::json out;
    out["server"] = {{"target", client.target},
                     {"backend", before.backend()},
                     {"device", before.device()},
                     {"version", before.version()},
                     {"kv_pool_capacity_bytes", before.kv_pool_capacity_bytes()},
                     {"kv_pool_used_bytes_before", before.kv_pool_used_bytes()},
                     {"kv_pool_used_bytes_after", after.kv_pool_used_bytes()}};
    out["workload"] = {{"batch", options.batch},
                       {"prompt_tokens", options.tokens},
                       {"decode_steps", options.steps},
                       {"kv_dtype", std::string(DTypeName(options.kv_dtype))},
                       {"kv_format", KvFormatText(options)},
                       {"seed", options.seed}};
    out["variants"] = nlohmann::json::array();
    for (const DemoRow& row : rows) {
      out["variants"].push_back({{"variant", row.label},
                                 {"spec", row.summary},
                                 {"parameters", row.parameters},
                                 {"kv_bytes_per_token", row.kv_bytes_per_token},
                                 {"kv_bytes_used", row.kv_bytes_used},
                                 {"prefill_ms_client", row.prefill_client_ms},
                                 {"prefill_ms_server_compute", row.prefill_server_ms},
                                 {"decode_ms_per_step_client", row.decode_client_ms},
                                 {"decode_ms_per_step_server_compute", row.decode_server_ms},
                                 {"final_sequence_length", row.final_sequence_length}});
    }
    out["failed"] = nlohmann::json::array();
    for (const DemoRow& row : failed) {
      out["failed"].push_back({{"variant", row.label}, {"spec", row.summary}, {"error", row.error}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return exit_code;
  }

  absl::PrintF("%-8s %10s %9s %7s %9s %8s  %11s %9s  %s\n", "", "", "KV bytes", "KV MiB", "prefill",
               "prefill", "decode", "decode", "");
  absl::PrintF("%-8s %10s %9s %7s %9s %8s  %11s %9s  %s\n", "variant", "params", "per tok",
               "in use", "ms", "srv ms", "ms/step", "srv ms", "spec");
  for (const DemoRow& row : rows) {
    absl::PrintF("%-8s %10d %9d %7.2f %9.2f %8.2f  %11.3f %9.3f  %s\n", row.label, row.parameters,
                 row.kv_bytes_per_token, row.kv_bytes_used / 1048576.0, row.prefill_client_ms,
                 row.prefill_server_ms, row.decode_client_ms, row.decode_server_ms, row.summary);
  }
  for (const DemoRow& row : failed) {
    absl::PrintF("%-8s FAILED  %s  (%s)\n", row.label, row.error, row.summary);
  }
  if (!rows.empty()) {
    absl::PrintF("\nKV bytes per token relative to %s:", rows.front().label);
    for (const DemoRow& row : rows) {
      absl::PrintF(" %s %.1f%%", row.label,
                   100.0 * row.kv_bytes_per_token / rows.front().kv_bytes_per_token);
    }
  }
  absl::PrintF(
      "\nms = measured by this client (one call for the whole batch, network included); "
      "srv ms = the server's compute time (Timing.compute_ns).\n");
  absl::PrintF(
      "KV pool in use after releasing every session: %.2f MiB (before the demo: %.2f MiB)\n",
      after.kv_pool_used_bytes() / 1048576.0, before.kv_pool_used_bytes() / 1048576.0);
  if (!failed.empty()) {
    absl::PrintF("%d of %d variants failed (above); exit status %d\n", failed.size(),
                 variants.size(), exit_code);
  }
  return exit_code;
}

}  // namespace attnserve

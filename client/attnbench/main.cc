// attnbench: a load generator for attnserve's decode path.
//
//   attnbench [--server=HOST:PORT] [--variants=mha,gqa,mqa,mla] [--context=512]
//             [--concurrency=1,4,16,64] [--duration=10s | --steps=N] [--metrics=HOST:PORT]
//             [--json] [--spec_file=spec.json] [--checkpoint=PATH --layer=N]
//             [--mode=closed_loop|open_loop] [--rate=R] [--sweep=1,4,16,64 --out_dir=DIR [--plot]]
//
// For every variant x context x concurrency C (one fresh session each): C concurrent
// DecodeStream streams decode one step at a time for --duration or --steps, each holding one
// request at a time: prefilled to context - steps_per_request / 2, decoded --steps_per_request
// steps, released and replaced, so the steps run at the requested mean context. Reported per cell: tokens/s (decode
// steps answered per second, all streams), its gain over C = 1 of the same variant and context
// in the same run, client-measured step latency p50/p90/p99, the server's queue and compute time
// per step (Timing), and the server's mean decode batch size where the server exposes one
// (client/attnbench/server_stats.h), "N/A" otherwise. A progress line is drawn on stderr when it
// is a terminal. A failed stream is counted and reported; the exit code is then 1 (0 when every
// stream succeeded, 2 for bad flags).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/attnbench/open_loop.h"
#include "client/attnbench/runner.h"
#include "client/attnbench/server_stats.h"
#include "client/attnbench/soak.h"
#include "client/common/client.h"
#include "client/common/status_names.h"
#include "client/common/demo_variants.h"
#include "kernels/base/command_line_usage.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/spec/layer_spec_json.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "Server address, HOST:PORT.");
ABSL_FLAG(bool, json, false, "Print the results as JSON on stdout instead of a table.");
ABSL_FLAG(std::vector<std::string>, variants,
          std::vector<std::string>({"mha", "gqa", "mqa", "mla"}),
          "Variants to run (client/common/demo_variants.h): mha, gqa, mqa, mla.");
ABSL_FLAG(std::vector<std::string>, context, std::vector<std::string>({"512"}),
          "Mean context the decode steps run at (each request is prefilled to context - "
          "steps_per_request / 2 and replaced after --steps_per_request steps); a list sweeps.");
ABSL_FLAG(int64_t, steps_per_request, 0,
          "Decode steps of each request before it is released and a fresh one prefilled on the "
          "same stream, holding the context steady; 0 = a quarter of the context.");
ABSL_FLAG(std::vector<std::string>, concurrency, std::vector<std::string>({"1", "4", "16", "64"}),
          "Concurrent DecodeStream streams (one request each); a list sweeps.");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10),
          "How long each cell decodes (ignored when --steps > 0).");
ABSL_FLAG(int64_t, steps, 0, "Decode steps per stream; 0 = run for --duration.");
ABSL_FLAG(absl::Duration, step_timeout, absl::Seconds(30),
          "A stream whose step (or end) has no answer for this long is cancelled and counted as "
          "an error.");
ABSL_FLAG(double, timeout_s, 120, "Deadline of each unary call (Configure, Forward prefill, ...).");
ABSL_FLAG(std::string, metrics, "",
          "The server's Prometheus endpoint, HOST:PORT or http://HOST:PORT/path, read for the "
          "attnserve_batch_size histogram (empty: batch sizes only from GetSession/GetServerInfo "
          "counters, when the server has them).");
ABSL_FLAG(std::string, spec_file, "",
           "A JSON layer spec (kernels/spec/layer_spec_json.h, as attnctl's --spec_file) to run "
           "instead of the demo variants (--variants, --d_model, --num_heads, --window ignored).");
ABSL_FLAG(std::string, checkpoint, "",
          "Weights from this checkpoint under the server's --checkpoint_root (layer --layer) "
          "instead of a seed; without --spec_file the spec is the one the server reads from the "
          "checkpoint (config.json or its safetensors metadata).");
ABSL_FLAG(int, layer, 0, "With --checkpoint: the layer index (model.layers.<layer>.self_attn.*).");
ABSL_FLAG(int, d_model, 512, "Hidden size of the demo variants.");
ABSL_FLAG(int, num_heads, 8, "Query heads of the demo variants.");
ABSL_FLAG(int, window, 0, "Sliding window of every variant (0 = full attention).");
ABSL_FLAG(std::string, kv_dtype, "f32", "KV cache dtype: f32, f16 or bf16.");
ABSL_FLAG(uint64_t, seed, 1, "Weights and inputs.");
ABSL_FLAG(int, soak_rounds, 0,
          "Soak mode when > 0: run the one cell (one variant, context and concurrency) this many "
          "rounds of --duration each, reading the server's resident memory after every round; "
          "fails on any error or an RSS drift after the warm-up of --soak_max_rss_drift or more "
          "(client/attnbench/soak.h).");
ABSL_FLAG(int, soak_warmup_rounds, 2, "Soak mode: rounds before the RSS baseline is taken.");
ABSL_FLAG(double, soak_max_rss_drift, 0.01,
          "Soak mode: largest allowed relative RSS growth from the warm-up to the end.");
ABSL_FLAG(int, soak_server_pid, 0,
          "Soak mode: read the server's RSS from /proc/PID/status (a local server); 0 = from "
          "--metrics (CPU backend).");
ABSL_FLAG(std::string, mode, "closed_loop",
          "closed_loop: --concurrency streams, each sending its next step when the last is "
          "answered; open_loop: requests arrive at --rate per second (Poisson), each a prefill of "
          "--prompt_tokens and --steps_per_request decode steps over its own stream.");
ABSL_FLAG(std::vector<std::string>, rate, std::vector<std::string>({"4"}),
          "open_loop: request arrivals per second; a list sweeps.");
ABSL_FLAG(int, prompt_tokens, 0, "open_loop: tokens prefilled per request; 0 = --context.");
ABSL_FLAG(int64_t, num_requests, 0,
          "open_loop: arrivals per rate; 0 = as many as arrive within --duration.");
ABSL_FLAG(int, max_in_flight, 256,
          "open_loop: requests running at once at most; a later arrival waits (counted as "
          "delayed, its TTFT still from its scheduled time).");
ABSL_FLAG(std::vector<std::string>, sweep, {},
          "The swept axis, in place of --concurrency (closed_loop) or --rate (open_loop), e.g. "
          "1,4,16,64; with --out_dir the rows go to sweep.csv and sweep.json there.");
ABSL_FLAG(std::string, out_dir, "",
          "Directory (created) for sweep.csv and sweep.json (the --json document), and "
          "sweep.png with --plot.");
ABSL_FLAG(bool, plot, false,
          "With --out_dir: draw sweep.png, step (inter-token) latency p50/p99 against "
          "throughput, with --plot_python and --plot_script (client/attnbench/plot_sweep.py).");
ABSL_FLAG(std::string, plot_python, ATTNSERVE_DEFAULT_PYTHON,
          "Python with matplotlib for --plot (deploy/setup.sh's .venv).");
ABSL_FLAG(std::string, plot_script, ATTNSERVE_SWEEP_PLOT_SCRIPT, "The --plot script.");
ABSL_FLAG(bool, progress, true, "Draw a progress line on stderr when it is a terminal.");

namespace attnserve {
namespace {

bool ParseIntList(const std::vector<std::string>& items, const char* flag, std::vector<int>* out) {
  for (const std::string& item : items) {
    int value = 0;
    if (!absl::SimpleAtoi(item, &value) || value <= 0) {
      ReportError(absl::StrCat("--", flag, ": '", item, "' is not a positive integer"));
      return false;
    }
    out->push_back(value);
  }
  if (out->empty()) {
    ReportError(absl::StrCat("--", flag, " is empty"));
    return false;
  }
  return true;
}

// Where the layers come from, for the header line.
std::string LayerDescription() {
  std::string text;
  if (!absl::GetFlag(FLAGS_spec_file).empty()) {
    text = absl::StrCat("spec ", absl::GetFlag(FLAGS_spec_file));
  } else if (absl::GetFlag(FLAGS_checkpoint).empty()) {
    text = absl::StrFormat("d_model %d, %d heads%s", absl::GetFlag(FLAGS_d_model),
                           absl::GetFlag(FLAGS_num_heads),
                           absl::GetFlag(FLAGS_window) > 0
                               ? absl::StrCat(", window ", absl::GetFlag(FLAGS_window))
                               : "");
  }
  if (!absl::GetFlag(FLAGS_checkpoint).empty()) {
    absl::StrAppend(&text, text.empty() ? "" : ", ", "weights from ",
                    absl::GetFlag(FLAGS_checkpoint), " layer ", absl::GetFlag(FLAGS_layer),
                    absl::GetFlag(FLAGS_spec_file).empty() ? " (its spec)" : "");
  } else {
    absl::StrAppend(&text, ", seed ", absl::GetFlag(FLAGS_seed));
  }
  return text;
}

BenchCell MakeCell(const NamedSpec& variant, int context, int concurrency) {
  BenchCell cell;
  cell.variant = variant;
  cell.context = context;
  cell.concurrency = concurrency;
  cell.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  cell.layer = absl::GetFlag(FLAGS_layer);
  cell.spec_from_checkpoint = !cell.checkpoint.empty() && absl::GetFlag(FLAGS_spec_file).empty();
  return cell;
}

// Throughput of C = 1 for the same variant and context, or 0.
double SingleStreamRate(const std::vector<BenchResult>& results, const BenchResult& row) {
  for (const BenchResult& other : results) {
    if (other.variant == row.variant && other.context == row.context && other.concurrency == 1 &&
        other.errors == 0) {
      return other.tokens_per_s;
    }
  }
  return 0;
}

nlohmann::json ResultJson(const std::vector<BenchResult>& results, const BenchResult& row) {
  const double single = SingleStreamRate(results, row);
  nlohmann::json batch = {{"available", row.batch.available}};
  if (row.batch.available) {
    batch["mean"] = row.batch.mean;
    batch["batches"] = row.batch.batches;
    batch["source"] = row.batch.source;
    batch["max"] = row.batch.max > 0 ? nlohmann::json(row.batch.max) : nlohmann::json(nullptr);
  } else {
    batch["mean"] = nullptr;
  }
  if (!row.batch.note.empty()) batch["note"] = row.batch.note;
  batch["seen_by_steps"] =
      row.step_batch_size > 0 ? nlohmann::json(row.step_batch_size) : nlohmann::json(nullptr);
  return {{"mode", "closed_loop"},
          {"variant", row.variant},
          {"label", row.label},
          {"spec", row.spec},
          {"context", row.context},
          {"concurrency", row.concurrency},
          {"kv_bytes_per_token", row.kv_bytes_per_token},
          {"steps", row.steps},
          {"seconds", row.seconds},
          {"tokens_per_s", row.tokens_per_s},
          {"gain_vs_1_stream", single > 0 ? nlohmann::json(row.tokens_per_s / single) : nullptr},
          {"wall_tokens_per_s", row.wall_tokens_per_s},
          {"tokens_cap_per_request", row.tokens_cap},
          {"steps_per_request", row.steps_per_request},
          {"prefill_tokens", row.prefill_tokens},
          {"mean_context", row.mean_context},
          {"max_context", row.max_context},
          {"reprefill",
           {{"count", row.reprefills},
            {"seconds_per_stream", row.reprefill_seconds},
            {"forward_ms", {{"mean", row.prefill_mean_ms},
                            {"p50", row.prefill_p50_ms},
                            {"p99", row.prefill_p99_ms}}}}},
          {"itl_ms",  // The same numbers under the open loop's name.
           {{"mean", row.latency_mean_ms},
            {"p50", row.latency_p50_ms},
            {"p90", row.latency_p90_ms},
            {"p99", row.latency_p99_ms},
            {"max", row.latency_max_ms}}},
          {"step_latency_ms",
           {{"mean", row.latency_mean_ms},
            {"p50", row.latency_p50_ms},
            {"p90", row.latency_p90_ms},
            {"p99", row.latency_p99_ms},
            {"max", row.latency_max_ms}}},
          {"server_ms_per_step",
           {{"queue", row.queue_ms}, {"compute", row.compute_ms}, {"total", row.server_total_ms}}},
          {"batch_size", batch},
          {"errors", row.errors},
          {"errors_by_code", row.errors_by_code},
          {"error_messages", row.error_messages}};
}

void PrintTable(const std::vector<BenchResult>& results) {
  absl::PrintF("%-8s %5s %7s %5s %5s %8s %10s %6s %8s %8s %8s %8s %8s %9s %7s %6s\n", "variant",
               "ctx", "mean", "max", "conc", "steps", "tok/s", "gain", "p50 ms", "p90 ms",
               "p99 ms", "queue ms", "comp ms", "prefill", "batch", "errors");
  bool any_batch = false;
  for (const BenchResult& row : results) {
    const double single = SingleStreamRate(results, row);
    const std::string gain = single > 0 ? absl::StrFormat("%.2fx", row.tokens_per_s / single) : "-";
    // The server's counters; else the step-weighted mean of Timing.batch_size, marked '*'.
    const std::string batch = row.batch.available ? absl::StrFormat("%.2f", row.batch.mean)
                              : row.step_batch_size > 0
                                  ? absl::StrFormat("%.2f*", row.step_batch_size)
                                  : std::string("N/A");
    any_batch = any_batch || row.batch.available || row.step_batch_size > 0;
    absl::PrintF(
        "%-8s %5d %7.1f %5d %5d %8d %10.1f %6s %8.3f %8.3f %8.3f %8.3f %8.3f %9s %7s %6d\n",
        row.label, row.context, row.mean_context, row.max_context, row.concurrency, row.steps,
        row.tokens_per_s, gain, row.latency_p50_ms, row.latency_p90_ms, row.latency_p99_ms,
        row.queue_ms, row.compute_ms,
        row.reprefills > 0 ? absl::StrFormat("%.2f(%d)", row.prefill_p50_ms, row.reprefills)
                           : std::string("-"),
        batch, row.errors);
  }
  absl::PrintF(
      "\nctx: the requested context; mean/max: the contexts the steps actually ran at (each "
      "request decodes %s steps, then a fresh one is prefilled); tok/s: decode steps answered "
      "per second, all streams, the time streams spent re-prefilling left out; gain: over 1 "
      "stream of the same variant and context in this run; p50/p90/p99: step latency measured "
      "by this client; queue/comp ms: the server's Timing per step (mean); prefill: p50 ms "
      "(count) of the re-prefills in the window; batch: the server's mean decode batch size.\n",
      results.empty() ? std::string("-") : absl::StrCat(results.front().steps_per_request));
  for (const BenchResult& row : results) {
    if (!row.batch.available && row.step_batch_size > 0) {
      absl::PrintF(
          "*: the mean over steps of Timing.batch_size (the server exposes no batch "
          "counters: %s)\n",
          row.batch.note);
      break;
    }
  }
  for (const BenchResult& row : results) {
    if (row.batch.available) {
      absl::PrintF("batch sizes of %s c=%d from %s\n", row.label, row.concurrency,
                   row.batch.source);
      break;
    }
  }
  if (!any_batch && !results.empty()) {
    absl::PrintF("batch: N/A (%s)\n", results.front().batch.note);
  }
  for (const BenchResult& row : results) {
    for (const std::string& message : row.error_messages) {
      absl::PrintF("error: %s c=%d ctx=%d %s\n", row.label, row.concurrency, row.context, message);
    }
  }
}

// The "server" object of both modes' JSON output.
nlohmann::json ServerJson(const Client& client, const v1::GetServerInfoResponse& info) {
  return {{"target", client.target},
          {"backend", info.backend()},
          {"device", info.device()},
          {"version", info.version()}};
}

nlohmann::json LatencyJson(const LatencySummary& l) {
  return {{"mean", l.mean}, {"p50", l.p50}, {"p90", l.p90}, {"p99", l.p99}, {"max", l.max}};
}

nlohmann::json OpenLoopJson(const OpenLoopResult& row) {
  return {{"mode", "open_loop"},
          {"variant", row.variant},
          {"label", row.label},
          {"spec", row.spec},
          {"rate", row.rate},
          {"prompt_tokens", row.prompt_tokens},
          {"decode_steps", row.decode_steps},
          {"steps_per_request", row.decode_steps},
          {"max_in_flight", row.max_in_flight},
          {"requests_sent", row.requests_sent},
          {"requests_completed", row.requests_completed},
          {"requests_delayed", row.requests_delayed},
          {"peak_in_flight", row.peak_in_flight},
          {"tokens", row.tokens},
          {"steps", row.tokens},
          {"arrival_seconds", row.arrival_seconds},
          {"seconds", row.seconds},
          {"achieved_rate", row.achieved_rate},
          {"request_throughput", row.request_throughput},
          {"tokens_per_s", row.tokens_per_s},
          {"mean_context", row.mean_context},
          {"ttft_ms", LatencyJson(row.ttft_ms)},
          {"itl_ms", LatencyJson(row.itl_ms)},
          {"e2e_ms", LatencyJson(row.e2e_ms)},
          {"errors", row.errors},
          {"errors_by_code", row.errors_by_code},
          {"error_messages", row.error_messages}};
}

void PrintOpenLoopTable(const std::vector<OpenLoopResult>& results) {
  absl::PrintF("%-8s %7s %7s %6s %6s %8s %9s %8s %8s %8s %8s %8s %8s %6s\n", "variant", "rate",
               "got", "reqs", "done", "req/s", "tok/s", "TTFT p50", "TTFT p99", "ITL p50",
               "ITL p90", "ITL p99", "E2E p50", "errors");
  for (const OpenLoopResult& row : results) {
    absl::PrintF("%-8s %7.2f %7.2f %6d %6d %8.2f %9.1f %8.2f %8.2f %8.3f %8.3f %8.3f %8.1f %6d\n",
                 row.label, row.rate, row.achieved_rate, row.requests_sent,
                 row.requests_completed, row.request_throughput, row.tokens_per_s,
                 row.ttft_ms.p50, row.ttft_ms.p99, row.itl_ms.p50, row.itl_ms.p90, row.itl_ms.p99,
                 row.e2e_ms.p50, row.errors);
  }
  absl::PrintF(
      "\nrate: requested arrivals/s (Poisson); got: arrivals/s offered; req/s and tok/s: "
      "completed requests and decode steps per second, first arrival to last answer; TTFT: "
      "scheduled arrival to the prefill's answer (ms); ITL: one decode step (ms); E2E: arrival "
      "to the last step's answer (ms).\n");
  for (const OpenLoopResult& row : results) {
    if (row.requests_delayed > 0) {
      absl::PrintF("note: %s rate %.2f: %d arrivals waited for one of --max_in_flight=%d\n",
                   row.label, row.rate, row.requests_delayed, row.max_in_flight);
    }
    for (const std::string& message : row.error_messages) {
      absl::PrintF("error: %s rate %.2f %s\n", row.label, row.rate, message);
    }
  }
}

bool ParseRateList(const std::vector<std::string>& items, const char* flag,
                   std::vector<double>* out) {
  for (const std::string& item : items) {
    double value = 0;
    if (!absl::SimpleAtod(item, &value) || !(value > 0) || !std::isfinite(value)) {
      ReportError(absl::StrCat("--", flag, ": '", item, "' is not a positive rate"));
      return false;
    }
    out->push_back(value);
  }
  if (out->empty()) {
    ReportError(absl::StrCat("--", flag, " is empty"));
    return false;
  }
  return true;
}

// One CSV line per result row of the --json document, the same columns in both modes (empty
// where a mode has no such value).
std::string SweepCsv(const nlohmann::json& out) {
  struct Column {
    const char* name;
    const char* pointer;  // JSON pointer into a result row
  };
  static const Column kColumns[] = {
      {"mode", "/mode"},
      {"variant", "/variant"},
      {"label", "/label"},
      {"context", "/context"},
      {"concurrency", "/concurrency"},
      {"rate", "/rate"},
      {"achieved_rate", "/achieved_rate"},
      {"prompt_tokens", "/prompt_tokens"},
      {"steps_per_request", "/steps_per_request"},
      {"mean_context", "/mean_context"},
      {"max_context", "/max_context"},
      {"steps", "/steps"},
      {"tokens_per_s", "/tokens_per_s"},
      {"request_throughput", "/request_throughput"},
      {"itl_p50_ms", "/itl_ms/p50"},
      {"itl_p90_ms", "/itl_ms/p90"},
      {"itl_p99_ms", "/itl_ms/p99"},
      {"ttft_p50_ms", "/ttft_ms/p50"},
      {"ttft_p90_ms", "/ttft_ms/p90"},
      {"ttft_p99_ms", "/ttft_ms/p99"},
      {"reprefill_p50_ms", "/reprefill/forward_ms/p50"},
      {"batch_mean", "/batch_size/mean"},
      {"errors", "/errors"},
  };
  std::string csv;
  for (const Column& column : kColumns) {
    absl::StrAppend(&csv, csv.empty() ? "" : ",", column.name);
  }
  csv += "\n";
  for (const nlohmann::json& row : out["results"]) {
    std::string line;
    bool first = true;
    for (const Column& column : kColumns) {
      if (!first) line += ",";
      first = false;
      const nlohmann::json::json_pointer pointer(column.pointer);
      if (!row.contains(pointer) || row.at(pointer).is_null()) continue;
      const nlohmann::json& value = row.at(pointer);
      if (value.is_string()) {
        std::string text = value.get<std::string>();
        if (text.find_first_of(",\"\n") != std::string::npos) {
          std::string quoted = "\"";
          for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
          text = quoted + "\"";
        }
        line += text;
      } else {
        line += value.dump();
      }
    }
    csv += line + "\n";
  }
  return csv;
}

absl::Status WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

// Runs `python script sweep.json --out sweep.png` and waits; its own output passes through.
absl::Status DrawSweepPlot(const std::filesystem::path& json_path,
                           const std::filesystem::path& png_path) {
  std::vector<std::string> args = {absl::GetFlag(FLAGS_plot_python),
                                   absl::GetFlag(FLAGS_plot_script), json_path.string(), "--out",
                                   png_path.string()};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  int status = 0;
  if (spawned == 0) waitpid(pid, &status, 0);
  if (spawned != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--plot: cannot run ", args[0],
        " (set --plot_python to a Python with matplotlib; deploy/setup.sh makes one in .venv)"));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("--plot: ", args[0], " ", args[1],
                                            " failed (exit status ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : -1, ")"));
  }
  return absl::OkStatus();
}

// --out_dir: sweep.json (the --json document), sweep.csv and, with --plot, sweep.png.
absl::Status WriteOutputs(const nlohmann::json& out, bool quiet) {
  const std::filesystem::path dir = absl::GetFlag(FLAGS_out_dir);
  if (dir.empty()) return absl::OkStatus();
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("--out_dir: ", dir.string(), ": ", error.message()));
  }
  if (absl::Status s = WriteFile(dir / "sweep.json", out.dump(2) + "\n"); !s.ok()) return s;
  if (absl::Status s = WriteFile(dir / "sweep.csv", SweepCsv(out)); !s.ok()) return s;
  if (absl::GetFlag(FLAGS_plot)) {
    if (absl::Status s = DrawSweepPlot(dir / "sweep.json", dir / "sweep.png"); !s.ok()) return s;
  }
  if (!quiet) {
    absl::PrintF("wrote %s, %s%s\n", (dir / "sweep.json").string(), (dir / "sweep.csv").string(),
                 absl::GetFlag(FLAGS_plot) ? absl::StrCat(", ", (dir / "sweep.png").string())
                                           : std::string());
  }
  return absl::OkStatus();
}

int Main() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "closed_loop" && mode != "open_loop") {
    return ReportError(absl::StrCat("--mode: '", mode, "' is not closed_loop or open_loop"));
  }
  const bool open_loop = mode == "open_loop";
  const std::vector<std::string> sweep = absl::GetFlag(FLAGS_sweep);
  if (absl::GetFlag(FLAGS_plot) && absl::GetFlag(FLAGS_out_dir).empty()) {
    return ReportError("--plot needs --out_dir");
  }
  std::vector<double> rates;
  if (open_loop) {
    if (!ParseRateList(sweep.empty() ? absl::GetFlag(FLAGS_rate) : sweep,
                       sweep.empty() ? "rate" : "sweep", &rates)) {
      return kExitUsage;
    }
    if (absl::GetFlag(FLAGS_max_in_flight) < 1) return ReportError("--max_in_flight must be >= 1");
    if (absl::GetFlag(FLAGS_num_requests) < 0) return ReportError("--num_requests must be >= 0");
    if (absl::GetFlag(FLAGS_soak_rounds) > 0) return ReportError("soak mode is closed_loop only");
  }
  std::vector<int> contexts, concurrencies;
  if (!ParseIntList(absl::GetFlag(FLAGS_context), "context", &contexts) ||
      !ParseIntList(sweep.empty() || open_loop ? absl::GetFlag(FLAGS_concurrency) : sweep,
                    sweep.empty() || open_loop ? "concurrency" : "sweep", &concurrencies)) {
    return kExitUsage;
  }
  absl::StatusOr<DType> kv_dtype = ParseDType(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return ReportError(absl::StrCat("--kv_dtype: ", kv_dtype.status().message()));
  std::vector<NamedSpec> variants;
  const std::string spec_file = absl::GetFlag(FLAGS_spec_file);
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  if (absl::GetFlag(FLAGS_layer) < 0) return ReportError("--layer must be >= 0");
  if (!spec_file.empty()) {
    std::ifstream file(spec_file);
    if (!file) return ReportError(absl::StrCat("--spec_file: cannot open ", spec_file));
    const std::string text((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
    absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(text);
    if (!spec.ok()) return ReportError(absl::StrCat(spec_file, ": ", spec.status().message()));
    variants.push_back({std::filesystem::path(spec_file).stem().string(), *spec});
  } else if (!checkpoint.empty()) {
    // The spec comes back from Configure; the label names the checkpoint and layer.
    variants.push_back({absl::StrCat(std::filesystem::path(checkpoint).stem().string(), "/L",
                                     absl::GetFlag(FLAGS_layer)),
                        LayerSpec()});
  } else {
    const std::vector<NamedSpec> all =
        DemoVariants(absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_num_heads),
                     absl::GetFlag(FLAGS_window));
    for (const std::string& name : absl::GetFlag(FLAGS_variants)) {
      absl::StatusOr<AttentionVariant> parsed = ParseVariant(name);
      if (!parsed.ok()) return ReportError(absl::StrCat("--variants: ", parsed.status().message()));
      for (const NamedSpec& spec : all) {
        if (spec.spec.variant == *parsed) variants.push_back(spec);
      }
    }
    if (variants.empty()) return ReportError("--variants is empty");
    for (const NamedSpec& variant : variants) {
      if (absl::Status valid = ValidateLayerSpec(variant.spec); !valid.ok()) {
        return ReportError(absl::StrCat("variant ", variant.label, ": ", valid.message()));
      }
    }
  }
  BenchOptions options;
  options.duration = absl::GetFlag(FLAGS_duration);
  options.steps = absl::GetFlag(FLAGS_steps);
  options.steps_per_request = absl::GetFlag(FLAGS_steps_per_request);
  if (options.steps_per_request < 0) return ReportError("--steps_per_request must be >= 0");
  options.step_timeout = absl::GetFlag(FLAGS_step_timeout);
  options.kv_dtype = *kv_dtype;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.progress = absl::GetFlag(FLAGS_progress);
  if (options.steps < 0 || (options.steps == 0 && options.duration <= absl::ZeroDuration())) {
    return ReportError("give --steps > 0 or a positive --duration");
  }
  if (options.step_timeout <= absl::ZeroDuration())
    return ReportError("--step_timeout must be > 0");

  const bool json = absl::GetFlag(FLAGS_json);
  absl::StatusOr<ChannelSecurity> security = ChannelSecurityFromFlags();
  if (!security.ok()) return ReportError(security.status().message());
  const Client client = MakeClient(absl::GetFlag(FLAGS_server),
                                   absl::Seconds(absl::GetFlag(FLAGS_timeout_s)), json, *security);
  v1::GetServerInfoResponse info;
  {
    grpc::ClientContext context;
    client.Prepare(&context);
    grpc::Status status = client.stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    if (!status.ok()) return ReportRpcError("GetServerInfo", status);
  }
  const std::string workload =
      options.steps > 0 ? absl::StrCat(options.steps, " steps per stream")
                        : absl::StrCat(absl::FormatDuration(options.duration), " per cell");
  if (!json) {
    absl::PrintF("attnbench — server %s: %s backend (%s), version %s\n", client.target,
                 info.backend(), info.device(), info.version());
  }
  if (!json && !open_loop) {
    absl::PrintF(
        "DecodeStream streams, one step outstanding per stream, each request replaced after "
        "%s steps; %s; KV cache %s; %s\n\n",
        options.steps_per_request > 0 ? absl::StrCat(options.steps_per_request)
                                      : std::string("context/4"),
        workload, DTypeName(options.kv_dtype), LayerDescription());
  }

  if (open_loop) {
    OpenLoopOptions open;
    open.duration = options.duration;
    open.num_requests = absl::GetFlag(FLAGS_num_requests);
    open.prompt_tokens =
        absl::GetFlag(FLAGS_prompt_tokens) > 0 ? absl::GetFlag(FLAGS_prompt_tokens) : contexts[0];
    open.decode_steps = options.steps_per_request > 0 ? options.steps_per_request
                                                      : DefaultStepsPerRequest(open.prompt_tokens);
    open.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
    open.step_timeout = options.step_timeout;
    open.kv_dtype = options.kv_dtype;
    open.seed = options.seed;
    if (!json) {
      absl::PrintF(
          "open loop: Poisson arrivals, %s; each request a prefill of %d tokens, then %d decode "
          "steps over its own DecodeStream; at most %d in flight; KV cache %s; %s\n\n",
          open.num_requests > 0 ? absl::StrCat(open.num_requests, " requests per rate")
                                : absl::StrCat(absl::FormatDuration(open.duration), " per rate"),
          open.prompt_tokens, open.decode_steps, open.max_in_flight, DTypeName(open.kv_dtype),
          LayerDescription());
    }
    std::vector<OpenLoopResult> results;
    int errors = 0;
    for (const NamedSpec& variant : variants) {
      for (double rate : rates) {
        open.rate = rate;
        results.push_back(RunOpenLoop(client, open, MakeCell(variant, open.prompt_tokens, 1)));
        errors += results.back().errors;
        if (!json) {
          std::fprintf(stderr, "[attnbench] %s rate=%.2f done: %.1f req/s, %d errors\n",
                       variant.label.c_str(), rate, results.back().request_throughput,
                       results.back().errors);
        }
      }
    }
    {
      nlohmann::json out;
      out["server"] = ServerJson(client, info);
      out["workload"] = {{"mode", "open_loop"},
                         {"prompt_tokens", open.prompt_tokens},
                         {"decode_steps", open.decode_steps},
                         {"num_requests", open.num_requests},
                         {"duration_s", absl::ToDoubleSeconds(open.duration)},
                         {"max_in_flight", open.max_in_flight},
                         {"kv_dtype", std::string(DTypeName(options.kv_dtype))},
                         {"spec_file", absl::GetFlag(FLAGS_spec_file)},
                         {"checkpoint", absl::GetFlag(FLAGS_checkpoint)},
                         {"layer", absl::GetFlag(FLAGS_layer)},
                         {"seed", options.seed}};
      out["results"] = nlohmann::json::array();
      for (const OpenLoopResult& row : results) out["results"].push_back(OpenLoopJson(row));
      out["errors"] = errors;
      if (json) {
        std::printf("%s\n", out.dump(2).c_str());
      } else {
        PrintOpenLoopTable(results);
      }
      if (absl::Status written = WriteOutputs(out, json); !written.ok()) {
        return ReportError(written.message(), kExitRpcError);
      }
    }
    return errors == 0 ? kExitOk : kExitRpcError;
  }

  const ServerBatchStats batch_stats(client, absl::GetFlag(FLAGS_metrics), absl::Seconds(5));
  if (absl::GetFlag(FLAGS_soak_rounds) > 0) {
    if (variants.size() != 1 || contexts.size() != 1 || concurrencies.size() != 1) {
      return ReportError("soak mode runs one cell: give one --variants, --context and --concurrency");
    }
    SoakOptions soak;
    soak.rounds = absl::GetFlag(FLAGS_soak_rounds);
    soak.warmup_rounds = absl::GetFlag(FLAGS_soak_warmup_rounds);
    soak.max_rss_drift = absl::GetFlag(FLAGS_soak_max_rss_drift);
    soak.server_pid = absl::GetFlag(FLAGS_soak_server_pid);
    soak.metrics_address = absl::GetFlag(FLAGS_metrics);
    if (soak.warmup_rounds < 1 || soak.warmup_rounds >= soak.rounds) {
      return ReportError("--soak_warmup_rounds must be in [1, --soak_rounds)");
    }
    options.progress = false;
    const SoakReport report = RunSoak(client, batch_stats, options,
                                      MakeCell(variants[0], contexts[0], concurrencies[0]), soak);
    if (json) {
      nlohmann::json out;
      out["soak"] = {{"variant", variants[0].label},
                     {"context", contexts[0]},
                     {"concurrency", concurrencies[0]},
                     {"rounds", soak.rounds},
                     {"round_s", absl::ToDoubleSeconds(options.duration)},
                     {"warmup_rounds", soak.warmup_rounds},
                     {"steps", report.steps},
                     {"errors", report.errors},
                     {"rss_after_warmup_bytes", report.rss_after_warmup},
                     {"rss_at_end_bytes", report.rss_at_end},
                     {"rss_floor_slope_bytes_per_round", report.floor_slope_bytes},
                     {"rss_floor_slope_stderr_bytes", report.floor_slope_stderr_bytes},
                     {"rss_growth_bytes", report.growth_bytes},
                     {"rss_mean_peak_bytes", report.mean_peak_bytes},
                     {"rss_drift", report.rss_drift},
                     {"passed", report.passed},
                     {"verdict", report.verdict}};
      nlohmann::json rounds = nlohmann::json::array();
      for (const SoakRound& r : report.rounds) {
        rounds.push_back({{"tokens_per_s", r.result.tokens_per_s},
                          {"errors", r.result.errors},
                          {"rss_bytes", r.rss_bytes},
                          {"peak_rss_bytes", r.peak_rss_bytes}});
      }
      out["soak"]["per_round"] = rounds;
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      absl::PrintF("soak %s ctx=%d c=%d: %d rounds of %s\n", variants[0].label, contexts[0],
                   concurrencies[0], soak.rounds,
                   options.steps > 0 ? absl::StrCat(options.steps, " steps per stream")
                                     : absl::FormatDuration(options.duration));
      absl::PrintF("%6s %12s %7s %14s %16s\n", "round", "tok/s", "errors", "peak RSS MiB",
                   "RSS after MiB");
      for (size_t i = 0; i < report.rounds.size(); ++i) {
        const SoakRound& r = report.rounds[i];
        absl::PrintF("%6d %12.1f %7d %14.1f %16.1f\n", i + 1, r.result.tokens_per_s,
                     r.result.errors, r.peak_rss_bytes / 1048576.0, r.rss_bytes / 1048576.0);
      }
      absl::PrintF("%d steps; %s\n", report.steps, report.verdict);
    }
    return report.passed ? kExitOk : kExitRpcError;
  }
  std::vector<BenchResult> results;
  int errors = 0;
  for (const NamedSpec& variant : variants) {
    for (int context : contexts) {
      for (int concurrency : concurrencies) {
        const BenchCell cell = MakeCell(variant, context, concurrency);
        results.push_back(RunCell(client, batch_stats, options, cell));
        errors += results.back().errors;
        if (!json && !options.progress) {
          std::fprintf(stderr, "[attnbench] %s ctx=%d c=%d done: %.1f tok/s, %d errors\n",
                       variant.label.c_str(), context, concurrency, results.back().tokens_per_s,
                       results.back().errors);
        }
      }
    }
  }

  {
    nlohmann::json out;
    out["server"] = ServerJson(client, info);
    out["workload"] = {{"mode", "closed_loop"},
                       {"stop", options.steps > 0 ? "steps" : "duration"},
                       {"steps_per_stream", options.steps},
                       {"steps_per_request", options.steps_per_request},
                       {"duration_s", absl::ToDoubleSeconds(options.duration)},
                       {"kv_dtype", std::string(DTypeName(options.kv_dtype))},
                       {"d_model", absl::GetFlag(FLAGS_d_model)},
                       {"num_heads", absl::GetFlag(FLAGS_num_heads)},
                       {"window", absl::GetFlag(FLAGS_window)},
                       {"spec_file", absl::GetFlag(FLAGS_spec_file)},
                       {"checkpoint", absl::GetFlag(FLAGS_checkpoint)},
                       {"layer", absl::GetFlag(FLAGS_layer)},
                       {"seed", options.seed}};
    out["results"] = nlohmann::json::array();
    for (const BenchResult& row : results) out["results"].push_back(ResultJson(results, row));
    out["errors"] = errors;
    if (json) {
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      PrintTable(results);
    }
    if (absl::Status written = WriteOutputs(out, json); !written.ok()) {
      return ReportError(written.message(), kExitRpcError);
    }
  }
  return errors == 0 ? kExitOk : kExitRpcError;
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  attnserve::SetCommandLineUsage(
      "attnbench",
      "attnbench [--server=HOST:PORT] [--variants=mha,gqa,mqa,mla] [--context=512] "
      "[--concurrency=1,4,16,64] [--duration=10s | --steps=N] [--metrics=HOST:PORT] [--json] "
      "[--spec_file=F | --checkpoint=P --layer=N] [--mode=open_loop --rate=R] "
      "[--sweep=1,4,16,64 --out_dir=DIR [--plot]]",
      {"client/attnbench/", "client/common/"});
  absl::ParseCommandLine(argc, argv);
  return attnserve::Main();
}

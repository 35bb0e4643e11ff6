#include "client/attnbench_soak.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/attnbench_server_stats.h"

namespace attnserve {

namespace {

// VmRSS of /proc/<pid>/status, in bytes; -1 when unreadable.
int64_t ProcResidentBytes(int pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    int64_t kilobytes = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kilobytes)) return kilobytes * 1024;
  }
  return -1;
}

// attnserve_device_memory_bytes{state="used"} from the Prometheus text; -1 when absent.
int64_t MetricsResidentBytes(const std::string& address) {
  std::string host_port = address;
  std::string path = "/metrics";
  absl::string_view rest = address;
  if (absl::ConsumePrefix(&rest, "http://")) {
    const size_t slash = rest.find('/');
    host_port = std::string(rest.substr(0, slash));
    if (slash != absl::string_view::npos) path = std::string(rest.substr(slash));
  }
  std::string body, error;
  if (!HttpGet(host_port, path, absl::Seconds(5), &body, &error)) return -1;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::ConsumePrefix(&line, "attnserve_device_memory_bytes{")) continue;
    if (line.find("state=\"used\"") == absl::string_view::npos) continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &value)) {
      return static_cast<int64_t>(value);
    }
  }
  return -1;
}

}  // namespace

int64_t ServerResidentBytes(const SoakOptions& soak) {
  if (soak.server_pid > 0) return ProcResidentBytes(soak.server_pid);
  if (!soak.metrics_address.empty()) return MetricsResidentBytes(soak.metrics_address);
  return -1;
}

SoakReport RunSoak(const Client& client, const ServerBatchStats& batch_stats,
                   const BenchOptions& options, const BenchCell& cell, const SoakOptions& soak) {
  SoakReport report;
  for (int round = 0; round < soak.rounds; ++round) {
    SoakRound r;
    r.result = RunCell(client, batch_stats, options, cell);
    r.rss_bytes = ServerResidentBytes(soak);
    report.errors += r.result.errors;
    report.steps += r.result.steps;
    std::fprintf(stderr, "[attnbench soak] round %d/%d: %.1f tok/s, %d errors, server RSS %s\n",
                 round + 1, soak.rounds, r.result.tokens_per_s, r.result.errors,
                 r.rss_bytes >= 0 ? absl::StrFormat("%.1f MiB", r.rss_bytes / 1048576.0).c_str()
                                  : "unknown");
    report.rounds.push_back(std::move(r));
  }
  const int warm = std::min(soak.warmup_rounds, soak.rounds) - 1;
  if (warm >= 0 && warm < soak.rounds - 1) {
    report.rss_after_warmup = report.rounds[warm].rss_bytes;
    report.rss_at_end = report.rounds.back().rss_bytes;
    report.rss_known = report.rss_after_warmup > 0 && report.rss_at_end > 0;
  }
  if (report.rss_known) {
    report.rss_drift = static_cast<double>(report.rss_at_end - report.rss_after_warmup) /
                       static_cast<double>(report.rss_after_warmup);
  }
  if (report.errors > 0) {
    report.verdict = absl::StrCat("FAILED: ", report.errors, " errors");
  } else if (!report.rss_known) {
    report.verdict =
        "FAILED: the server's resident memory could not be read (give --soak_server_pid, or "
        "--metrics of a CPU-backend server), or too few rounds after the warm-up";
  } else if (report.rss_drift >= soak.max_rss_drift) {
    report.verdict = absl::StrFormat("FAILED: RSS drift %.2f%% after warm-up, limit %.2f%%",
                                     100 * report.rss_drift, 100 * soak.max_rss_drift);
  } else {
    report.passed = true;
    report.verdict =
        absl::StrFormat("passed: 0 errors, RSS drift %.2f%% after warm-up (limit %.2f%%)",
                        100 * report.rss_drift, 100 * soak.max_rss_drift);
  }
  return report;
}

}  // namespace attnserve

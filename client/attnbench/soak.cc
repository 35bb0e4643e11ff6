#include "client/attnbench/soak.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "client/attnbench/server_stats.h"

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

namespace {

// Samples the server's RSS twice a second on its own thread while a round runs.
class PeakSampler {
 public:
  explicit PeakSampler(const SoakOptions& soak)
      : thread_([this, &soak] {
          absl::MutexLock lock(&mu_);
          while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(500))) {
            mu_.Unlock();
            const int64_t rss = ServerResidentBytes(soak);
            mu_.Lock();
            peak_ = std::max(peak_, rss);
          }
        }) {}
  // Stops sampling; the largest sample (-1 when none could be read).
  int64_t Finish() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    absl::MutexLock lock(&mu_);
    return peak_;
  }

 private:
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = -1;
  std::thread thread_;
};

}  // namespace

SoakReport RunSoak(const Client& client, const ServerBatchStats& batch_stats,
                   const BenchOptions& options, const BenchCell& cell, const SoakOptions& soak) {
  SoakReport report;
  for (int round = 0; round < soak.rounds; ++round) {
    SoakRound r;
    PeakSampler sampler(soak);
    r.result = RunCell(client, batch_stats, options, cell);
    r.peak_rss_bytes = sampler.Finish();
    r.rss_bytes = ServerResidentBytes(soak);
    r.peak_rss_bytes = std::max(r.peak_rss_bytes, r.rss_bytes);
    report.errors += r.result.errors;
    report.steps += r.result.steps;
    std::fprintf(stderr,
                 "[attnbench soak] round %d/%d: %.1f tok/s, %d errors, server RSS peak %.1f MiB, "
                 "after the round %.1f MiB\n",
                 round + 1, soak.rounds, r.result.tokens_per_s, r.result.errors,
                 r.peak_rss_bytes / 1048576.0, r.rss_bytes / 1048576.0);
    report.rounds.push_back(std::move(r));
  }
  // Least squares over the rounds after the warm-up: floor = a + slope * round.
  std::vector<double> xs, floors;
  double peaks = 0;
  report.rss_known = soak.rounds - soak.warmup_rounds >= 3;
  for (int i = soak.warmup_rounds; i < soak.rounds; ++i) {
    const SoakRound& r = report.rounds[i];
    if (r.rss_bytes <= 0 || r.peak_rss_bytes <= 0) report.rss_known = false;
    xs.push_back(i);
    floors.push_back(static_cast<double>(r.rss_bytes));
    peaks += static_cast<double>(r.peak_rss_bytes);
  }
  if (report.rss_known) {
    const double n = static_cast<double>(xs.size());
    double mx = 0, my = 0;
    for (size_t i = 0; i < xs.size(); ++i) mx += xs[i] / n, my += floors[i] / n;
    double sxx = 0, sxy = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      sxx += (xs[i] - mx) * (xs[i] - mx);
      sxy += (xs[i] - mx) * (floors[i] - my);
    }
    report.floor_slope_bytes = sxy / sxx;
    double residuals = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double fit = my + report.floor_slope_bytes * (xs[i] - mx);
      residuals += (floors[i] - fit) * (floors[i] - fit);
    }
    report.floor_slope_stderr_bytes = std::sqrt(residuals / (n - 2) / sxx);
    report.growth_bytes = report.floor_slope_bytes * (n - 1);
    report.mean_peak_bytes = peaks / n;
    report.rss_drift = report.growth_bytes / report.mean_peak_bytes;
    report.rss_after_warmup = report.rounds[soak.warmup_rounds - 1].rss_bytes;
    report.rss_at_end = report.rounds.back().rss_bytes;
  }
  if (report.errors > 0) {
    report.verdict = absl::StrCat("FAILED: ", report.errors, " errors");
  } else if (!report.rss_known) {
    report.verdict =
        "FAILED: the server's resident memory could not be read (give --soak_server_pid, or "
        "--metrics of a CPU-backend server), or fewer than 3 rounds after the warm-up";
  } else {
    report.passed = report.rss_drift < soak.max_rss_drift;
    report.verdict = absl::StrFormat(
        "%s: %d errors; RSS floor trend %+.3f ± %.3f MiB per round after the warm-up, %+.2f MiB "
        "over the soak = %.2f%% of the %.1f MiB working set (limit %.2f%%)",
        report.passed ? "passed" : "FAILED", report.errors, report.floor_slope_bytes / 1048576.0,
        report.floor_slope_stderr_bytes / 1048576.0, report.growth_bytes / 1048576.0,
        100 * report.rss_drift, report.mean_peak_bytes / 1048576.0, 100 * soak.max_rss_drift);
  }
  return report;
}

}  // namespace attnserve

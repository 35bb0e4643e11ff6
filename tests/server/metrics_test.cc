// Prometheus metrics of the real attnserve_server (docs/metrics.md): the server is started with
// --metrics_address=127.0.0.1:0 and --metrics_port_file, driven through Configure / Forward /
// Decode / DecodeStream / Release and calls that fail, and /metrics is read with a plain HTTP GET
// over a TCP socket (no client library). Every name of the metric contract must be present with
// its labels, and the values must match what the test did.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/reference/test_cases.h"
#include "tests/support/await_until.h"
#include "tests/support/metrics_fixture.h"

namespace attnserve::server_test {
namespace {

using reference::FindSpec;
using Labels = std::map<std::string, std::string>;

struct Sample {
  std::string name;
  Labels labels;
  double value = 0;
};

// The text exposition format: `# TYPE name type` lines and `name{k="v",...} value` samples.
struct Exposition {
  std::map<std::string, std::string> types;  // Family name -> counter/gauge/histogram.
  std::vector<Sample> samples;

  static Exposition Parse(const std::string& text) {
    Exposition e;
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      if (absl::ConsumePrefix(&line, "# TYPE ")) {
        std::vector<std::string> parts = absl::StrSplit(line, ' ');
        if (parts.size() == 2) e.types[parts[0]] = parts[1];
        continue;
      }
      if (line.empty() || line[0] == '#') continue;
      Sample s;
      const size_t brace = line.find('{');
      const size_t space = line.rfind(' ');
      if (space == absl::string_view::npos) continue;
      if (brace != absl::string_view::npos && brace < space) {
        s.name = std::string(line.substr(0, brace));
        const size_t close = line.rfind('}', space);
        absl::string_view labels = line.substr(brace + 1, close - brace - 1);
        // Label values here never hold `",` (no escapes in this server's values but the device
        // description, which has no quotes).
        for (absl::string_view pair : absl::StrSplit(labels, "\",", absl::SkipEmpty())) {
          const size_t eq = pair.find("=\"");
          if (eq == absl::string_view::npos) continue;
          absl::string_view value = pair.substr(eq + 2);
          absl::ConsumeSuffix(&value, "\"");
          s.labels[std::string(pair.substr(0, eq))] = std::string(value);
        }
      } else {
        s.name = std::string(line.substr(0, space));
      }
      absl::string_view value = line.substr(space + 1);
      if (value == "+Inf") {
        s.value = 1e308;
      } else if (!absl::SimpleAtod(value, &s.value)) {
        continue;
      }
      e.samples.push_back(std::move(s));
    }
    return e;
  }

  // The sum of the samples named `name` whose labels include `labels`; nullopt when none match.
  std::optional<double> Get(const std::string& name, const Labels& labels = {}) const {
    std::optional<double> sum;
    for (const Sample& s : samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : labels) {
        auto it = s.labels.find(k);
        if (it == s.labels.end() || it->second != v) {
          match = false;
          break;
        }
      }
      if (match) sum = sum.value_or(0) + s.value;
    }
    return sum;
  }
  // The number of samples named `name` whose labels include `labels`.
  int Count(const std::string& name, const Labels& labels = {}) const {
    int n = 0;
    for (const Sample& s : samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : labels) {
        auto it = s.labels.find(k);
        match = match && it != s.labels.end() && it->second == v;
      }
      n += match ? 1 : 0;
    }
    return n;
  }
  // Get(), or -1 when absent (so EXPECT_EQ prints something useful).
  double Value(const std::string& name, const Labels& labels = {}) const {
    return Get(name, labels).value_or(-1);
  }
};

// ---- Fixture ---------------------------------------------------------------------------------

constexpr int64_t kPoolBytes = 262144;  // Small, so a long Forward runs out of KV memory.

class MetricsTest : public MetricsServerTest {
 protected:
  std::vector<std::string> ServerFlags() const override {
    std::vector<std::string> flags = {absl::StrCat("--kv_pool_bytes=", kPoolBytes)};
    for (const std::string& f : MoreFlags()) flags.push_back(f);
    return flags;
  }
  virtual std::vector<std::string> MoreFlags() const { return {}; }

  Exposition Scrape() {
    absl::StatusOr<std::string> body = ScrapeMetrics(metrics_port_);
    EXPECT_TRUE(body.ok()) << body.status();
    return Exposition::Parse(body.ok() ? *body : "");
  }

  v1::ConfigureResponse Configure(const LayerSpec& spec) {
    v1::ConfigureResponse configured;
    grpc::Status status =
        attnserve::server_test::Configure(stub(), SeedConfigure(spec, 1), &configured);
    EXPECT_TRUE(status.ok()) << Describe(status);
    return configured;
  }

  grpc::Status Prefill(const std::string& session, const std::string& id, int64_t tokens,
                       int64_t d) {
    v1::ForwardRequest request;
    request.set_session_id(session);
    *request.add_items() = MakeForwardItem(id, RandomHidden(tokens, d, rng_));
    v1::ForwardResponse response;
    return Forward(stub(), request, &response);
  }

  grpc::Status Step(const std::string& session, const std::string& id, int64_t d) {
    v1::DecodeRequest request;
    request.set_session_id(session);
    *request.add_items() = MakeDecodeItem(id, RandomHidden(1, d, rng_));
    v1::DecodeResponse response;
    return Decode(stub(), request, &response);
  }

  std::mt19937_64 rng_{11};
};

// Every name of the contract in docs/metrics.md, with its type.
const std::map<std::string, std::string>& ContractTypes() {
  static const auto* kTypes = new std::map<std::string, std::string>{
      {"attnserve_kv_pool_capacity_bytes", "gauge"},
      {"attnserve_kv_pool_used_bytes", "gauge"},
      {"attnserve_kv_pool_pages", "gauge"},
      {"attnserve_kv_bytes_per_token", "gauge"},
      {"attnserve_sessions_active", "gauge"},
      {"attnserve_requests_active", "gauge"},
      {"attnserve_rpc_duration_seconds", "histogram"},
      {"attnserve_queue_wait_seconds", "histogram"},
      {"attnserve_compute_seconds", "histogram"},
      {"attnserve_batch_size", "histogram"},
      {"attnserve_batch_tokens", "histogram"},
      {"attnserve_prefill_tokens_total", "counter"},
      {"attnserve_decode_tokens_total", "counter"},
      {"attnserve_decode_step_seconds", "histogram"},
      {"attnserve_rpc_errors_total", "counter"},
      {"attnserve_kv_rejections_total", "counter"},
      {"attnserve_expired_total", "counter"},
      {"attnserve_device_memory_bytes", "gauge"},
      {"attnserve_build_info", "gauge"},
      {"process_resident_memory_bytes", "gauge"},
      {"process_virtual_memory_bytes", "gauge"},
      {"process_cpu_seconds_total", "counter"},
      {"process_open_fds", "gauge"},
      {"process_max_fds", "gauge"},
      {"process_start_time_seconds", "gauge"},
  };
  return *kTypes;
}

TEST_F(MetricsTest, EveryContractMetricWithLabelsAndValues) {
  // Before any session: the pool and device series are there already.
  {
    const Exposition e = Scrape();
    // Capacity: one series of the replica, no variant. Used: present (0) before any session, so
    // that sum() over an idle replica is 0 rather than nothing.
    EXPECT_EQ(e.Count("attnserve_kv_pool_capacity_bytes"), 1);
    EXPECT_EQ(e.Value("attnserve_kv_pool_capacity_bytes"), kPoolBytes);
    EXPECT_EQ(e.Value("attnserve_kv_pool_used_bytes"), 0);
    EXPECT_EQ(e.Value("attnserve_kv_pool_used_bytes", {{"variant", "none"}}), 0);
    EXPECT_GT(e.Value("attnserve_device_memory_bytes", {{"state", "used"}}), 0);
  }

  struct Case {
    const char* spec;
    const char* variant;
    int prompt;
    int unary_steps;
    int stream_steps;
  };
  const std::vector<Case> cases = {
      {"gqa2_half_bias_hd16_theta5e5", "gqa", 5, 3, 0},
      {"mla_q24_half", "mla", 7, 2, 2},
      {"mha_interleaved_bias_window16", "mha_swa", 20, 4, 0},
      {"mqa_half", "mqa", 3, 1, 3},
  };
  std::map<std::string, v1::ConfigureResponse> sessions;
  for (const Case& c : cases) {
    const LayerSpec spec = FindSpec(c.spec).spec;
    const v1::ConfigureResponse configured = Configure(spec);
    ASSERT_FALSE(configured.session_id().empty());
    sessions[c.variant] = configured;
    const std::string& id = configured.session_id();
    ASSERT_TRUE(Prefill(id, "r", c.prompt, spec.d_model).ok());
    for (int i = 0; i < c.unary_steps; ++i) ASSERT_TRUE(Step(id, "r", spec.d_model).ok());
    if (c.stream_steps > 0) {
      grpc::ClientContext context;
      SetDeadline(context);
      auto stream = stub().DecodeStream(&context);
      for (int i = 0; i < c.stream_steps; ++i) {
        v1::DecodeRequest request;
        request.set_session_id(id);
        *request.add_items() = MakeDecodeItem("r", RandomHidden(1, spec.d_model, rng_));
        ASSERT_TRUE(stream->Write(request));
        v1::DecodeResponse response;
        ASSERT_TRUE(stream->Read(&response));
      }
      ASSERT_TRUE(stream->WritesDone());
      grpc::Status finished = stream->Finish();
      ASSERT_TRUE(finished.ok()) << Describe(finished);
    }
  }
  const LayerSpec gqa = FindSpec("gqa2_half_bias_hd16_theta5e5").spec;
  const std::string& gqa_session = sessions["gqa"].session_id();

  // Errors: unknown session (variant "none"), unknown request (the session's variant), a prompt
  // too large for the KV pool (RESOURCE_EXHAUSTED for KV memory), a stream ending on NOT_FOUND.
  EXPECT_EQ(Step("0123456789abcdef0123456789abcdef", "r", gqa.d_model).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Step(gqa_session, "nope", gqa.d_model).error_code(), grpc::StatusCode::NOT_FOUND);
  const int64_t too_many = 2 * kPoolBytes / KvBytesPerToken(gqa, DType::kF32);
  EXPECT_EQ(Prefill(gqa_session, "big", too_many, gqa.d_model).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  {
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub().DecodeStream(&context);
    v1::DecodeRequest request;
    request.set_session_id(gqa_session);
    *request.add_items() = MakeDecodeItem("nope", RandomHidden(1, gqa.d_model, rng_));
    ASSERT_TRUE(stream->Write(request));
    stream->WritesDone();
    v1::DecodeResponse response;
    EXPECT_FALSE(stream->Read(&response));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // The server-wide calls.
  absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub());
  ASSERT_TRUE(info.ok()) << info.status();
  {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::GetSessionRequest request;
    request.set_session_id(gqa_session);
    v1::GetSessionResponse response;
    ASSERT_TRUE(stub().GetSession(&context, request, &response).ok());
  }
  {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::ListSessionsResponse response;
    ASSERT_TRUE(stub().ListSessions(&context, v1::ListSessionsRequest(), &response).ok());
  }

  const Exposition e = Scrape();
  for (const auto& [name, type] : ContractTypes()) {
    auto it = e.types.find(name);
    ASSERT_NE(it, e.types.end()) << name << " is missing from /metrics";
    EXPECT_EQ(it->second, type) << name;
  }
  for (const Sample& s : e.samples) {
    if (s.name.rfind("attnserve_", 0) != 0) continue;
    EXPECT_EQ(s.labels.count("session_id"), 0u) << s.name;
    EXPECT_EQ(s.labels.count("request_id"), 0u) << s.name;
    // An aggregate is a query, not a series: a variant="all" series would make every sum()
    // over a per-variant metric count the pool twice.
    EXPECT_NE(s.labels.count("variant") ? s.labels.at("variant") : "", "all") << s.name;
  }

  // Pool: capacity once (the replica's), and the variants' use sums to GetServerInfo's
  // (nothing ran in between; nothing is in transit, so variant="none" holds 0).
  EXPECT_EQ(e.Count("attnserve_kv_pool_capacity_bytes"), 1);
  EXPECT_EQ(e.Value("attnserve_kv_pool_capacity_bytes", {}), info->kv_pool_capacity_bytes());
  EXPECT_EQ(e.Value("attnserve_kv_pool_capacity_bytes", {}), kPoolBytes);
  EXPECT_EQ(e.Value("attnserve_kv_pool_used_bytes"), info->kv_pool_used_bytes());
  EXPECT_EQ(e.Value("attnserve_kv_pool_used_bytes", {{"variant", "none"}}), 0);
  EXPECT_LE(e.Value("attnserve_kv_pool_used_bytes"), e.Value("attnserve_kv_pool_capacity_bytes"));
  double used_by_variants = 0;
  for (const Case& c : cases) {
    const Labels v = {{"variant", c.variant}};
    const v1::SessionCost& cost = sessions[c.variant].cost();
    SCOPED_TRACE(c.variant);
    EXPECT_EQ(e.Count("attnserve_kv_pool_capacity_bytes", v), 0) << "capacity is not per variant";
    const double used = e.Value("attnserve_kv_pool_used_bytes", v);
    EXPECT_GT(used, 0);
    used_by_variants += used;
    EXPECT_EQ(e.Value("attnserve_kv_pool_pages", {{"variant", c.variant}, {"state", "used"}}),
              used / cost.page_bytes());
    EXPECT_EQ(e.Value("attnserve_kv_pool_pages", {{"variant", c.variant}, {"state", "free"}}),
              (kPoolBytes - info->kv_pool_used_bytes()) / cost.page_bytes());
    EXPECT_EQ(e.Value("attnserve_kv_bytes_per_token", v), cost.kv_bytes_per_token());
    EXPECT_EQ(e.Value("attnserve_sessions_active", v), 1);
    EXPECT_EQ(e.Value("attnserve_requests_active", v), 1);

    // Calls and tokens.
    const int steps = c.unary_steps + c.stream_steps;
    EXPECT_EQ(e.Value("attnserve_rpc_duration_seconds_count",
                      {{"rpc", "configure"}, {"variant", c.variant}}),
              1);
    EXPECT_EQ(e.Value("attnserve_rpc_duration_seconds_count",
                      {{"rpc", "decode"}, {"variant", c.variant}}),
              c.unary_steps + (c.variant == std::string("gqa") ? 1 : 0));
    if (c.stream_steps > 0) {
      EXPECT_EQ(e.Value("attnserve_rpc_duration_seconds_count",
                        {{"rpc", "decode_stream"}, {"variant", c.variant}}),
                c.stream_steps);
      EXPECT_EQ(e.Value("attnserve_queue_wait_seconds_count",
                        {{"rpc", "decode_stream"}, {"variant", c.variant}}),
                c.stream_steps);
    }
    EXPECT_EQ(
        e.Value("attnserve_compute_seconds_count", {{"rpc", "forward"}, {"variant", c.variant}}),
        c.variant == std::string("gqa") ? 2 : 1);
    EXPECT_GT(
        e.Value("attnserve_compute_seconds_sum", {{"rpc", "forward"}, {"variant", c.variant}}), 0);
    EXPECT_EQ(e.Value("attnserve_decode_tokens_total", v), steps);
    EXPECT_EQ(e.Value("attnserve_prefill_tokens_total", v), c.prompt);
    // Whatever the batching, the sequences of all backend calls add up to the work done, and
    // every step ran in some decode call.
    EXPECT_EQ(e.Value("attnserve_batch_size_sum", v), 1 + steps);
    EXPECT_EQ(e.Value("attnserve_batch_tokens_sum", v), c.prompt + steps);
    EXPECT_GE(e.Value("attnserve_batch_size_count", v), 2);
    EXPECT_GE(e.Value("attnserve_decode_step_seconds_count", v), 1);
    EXPECT_LE(e.Value("attnserve_decode_step_seconds_count", v), steps);
    EXPECT_EQ(e.Value("attnserve_batch_size_bucket", {{"variant", c.variant}, {"le", "+Inf"}}),
              e.Value("attnserve_batch_size_count", v));
  }
  EXPECT_EQ(used_by_variants, info->kv_pool_used_bytes());

  // Errors by rpc, code and variant.
  EXPECT_EQ(e.Value("attnserve_rpc_errors_total",
                    {{"rpc", "decode"}, {"code", "NOT_FOUND"}, {"variant", "none"}}),
            1);
  EXPECT_EQ(e.Value("attnserve_rpc_errors_total",
                    {{"rpc", "decode"}, {"code", "NOT_FOUND"}, {"variant", "gqa"}}),
            1);
  EXPECT_EQ(e.Value("attnserve_rpc_errors_total",
                    {{"rpc", "forward"}, {"code", "RESOURCE_EXHAUSTED"}, {"variant", "gqa"}}),
            1);
  EXPECT_EQ(e.Value("attnserve_rpc_errors_total",
                    {{"rpc", "decode_stream"}, {"code", "NOT_FOUND"}, {"variant", "gqa"}}),
            1);
  EXPECT_EQ(e.Value("attnserve_rpc_errors_total"), 4) << "no other errors";
  EXPECT_EQ(e.Value("attnserve_kv_rejections_total", {{"variant", "gqa"}}), 1);
  EXPECT_EQ(e.Value("attnserve_kv_rejections_total"), 1);
  EXPECT_EQ(e.Value("attnserve_kv_rejections_total", {{"variant", "mla"}}), 0);
  EXPECT_EQ(e.Value("attnserve_expired_total", {{"variant", "mqa"}, {"kind", "request"}}), 0);
  EXPECT_EQ(
      e.Value("attnserve_rpc_duration_seconds_count", {{"rpc", "decode"}, {"variant", "none"}}), 1);
  EXPECT_EQ(e.Value("attnserve_rpc_duration_seconds_count",
                    {{"rpc", "get_server_info"}, {"variant", "none"}}),
            1);
  EXPECT_EQ(e.Value("attnserve_rpc_duration_seconds_count",
                    {{"rpc", "list_sessions"}, {"variant", "none"}}),
            1);
  EXPECT_EQ(
      e.Value("attnserve_rpc_duration_seconds_count", {{"rpc", "get_session"}, {"variant", "gqa"}}),
      1);

  // Device and build.
  const double rss = e.Value("attnserve_device_memory_bytes", {{"state", "used"}});
  EXPECT_GT(rss, 1 << 20);
  EXPECT_GE(e.Value("attnserve_device_memory_bytes", {{"state", "total"}}), rss);
  EXPECT_EQ(e.Value("attnserve_build_info", {{"backend", "cpu"}, {"version", info->version()}}), 1);
  EXPECT_EQ(e.Count("attnserve_build_info"), 1);
  EXPECT_EQ(e.Value("attnserve_build_info", {{"replica", info->replica()}}), 1) << info->replica();

  // process_*: the Prometheus client conventions' names, from /proc/self.
  const double resident = e.Value("process_resident_memory_bytes");
  EXPECT_GT(resident, 1 << 20);
  EXPECT_LT(std::abs(resident - rss), 64 << 20) << "process RSS and device memory (VmRSS) differ";
  EXPECT_GE(e.Value("process_virtual_memory_bytes"), resident);
  EXPECT_GT(e.Value("process_cpu_seconds_total"), 0);
  EXPECT_GE(e.Value("process_open_fds"), 3);  // stdin, stdout, stderr at least; sockets too.
  EXPECT_GE(e.Value("process_max_fds"), e.Value("process_open_fds"));
  const double now_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_GT(e.Value("process_start_time_seconds"), now_s - 600) << "started in the last 10 min";
  EXPECT_LE(e.Value("process_start_time_seconds"), now_s + 2);
  for (const char* name : {"process_resident_memory_bytes", "process_cpu_seconds_total",
                           "process_open_fds", "process_max_fds", "process_start_time_seconds"}) {
    EXPECT_EQ(e.Count(name), 1) << name;
  }

  // Release a request, then the session: its variant's state series drop to 0 (or go away for
  // the per-live-session ones) while capacity stays.
  ASSERT_TRUE(Release(stub(), gqa_session, "r").ok());
  {
    const Exposition after = Scrape();
    EXPECT_EQ(after.Value("attnserve_requests_active", {{"variant", "gqa"}}), 0);
    EXPECT_EQ(after.Value("attnserve_kv_pool_used_bytes", {{"variant", "gqa"}}), 0);
    EXPECT_EQ(after.Value("attnserve_sessions_active", {{"variant", "gqa"}}), 1);
  }
  ASSERT_TRUE(Release(stub(), gqa_session, "").ok());
  {
    const Exposition after = Scrape();
    EXPECT_EQ(after.Value("attnserve_sessions_active", {{"variant", "gqa"}}), 0);
    EXPECT_EQ(after.Count("attnserve_kv_pool_capacity_bytes"), 1);
    EXPECT_EQ(after.Value("attnserve_kv_pool_capacity_bytes"), kPoolBytes);
    EXPECT_EQ(after.Value("attnserve_kv_pool_used_bytes", {{"variant", "gqa"}}), 0);
    EXPECT_FALSE(after.Get("attnserve_kv_bytes_per_token", {{"variant", "gqa"}}).has_value());
    EXPECT_FALSE(
        after.Get("attnserve_kv_pool_pages", {{"variant", "gqa"}, {"state", "free"}}).has_value());
    EXPECT_EQ(after.Value("attnserve_rpc_duration_seconds_count",
                          {{"rpc", "release"}, {"variant", "gqa"}}),
              2);
    EXPECT_EQ(after.Value("attnserve_sessions_active", {{"variant", "mla"}}), 1);
  }
}

class MetricsTtlTest : public MetricsTest {
 protected:
  std::vector<std::string> MoreFlags() const override {
    return {"--request_ttl=500ms", "--session_ttl=1500ms"};
  }
};

TEST_F(MetricsTtlTest, ExpiriesAreCountedByKind) {
  const LayerSpec spec = FindSpec("gqa2_half_window7").spec;
  const v1::ConfigureResponse configured = Configure(spec);
  ASSERT_TRUE(Prefill(configured.session_id(), "idle", 9, spec.d_model).ok());

  // Sweeps run every 125 ms: the request goes after ~0.5 s, the session after ~1.5 s.
  Exposition e;
  AwaitUntil(
      [&] {
        e = Scrape();
        return e.Value("attnserve_expired_total", {{"variant", "gqa_swa"}, {"kind", "session"}}) >=
               1;
      },
      std::chrono::seconds(15), std::chrono::milliseconds(100));
  EXPECT_EQ(e.Value("attnserve_expired_total", {{"variant", "gqa_swa"}, {"kind", "request"}}), 1);
  EXPECT_EQ(e.Value("attnserve_expired_total", {{"variant", "gqa_swa"}, {"kind", "session"}}), 1);
  EXPECT_EQ(e.Value("attnserve_sessions_active", {{"variant", "gqa_swa"}}), 0);
  EXPECT_EQ(e.Value("attnserve_requests_active", {{"variant", "gqa_swa"}}), 0);
  EXPECT_EQ(e.Value("attnserve_kv_pool_used_bytes"), 0);
  EXPECT_EQ(e.Count("attnserve_kv_pool_used_bytes", {{"variant", "all"}}), 0);
}

TEST(MetricsFlagsTest, UnbindableAddressFailsStartup) {
  // Hold a listening socket, then ask the server for the same address.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int taken = ntohs(addr.sin_port);
  absl::StatusOr<std::unique_ptr<ServerProcess>> started =
      ServerProcess::Start({absl::StrCat("--metrics_address=127.0.0.1:", taken), "--threads=1"},
                           std::chrono::seconds(10));
  close(fd);
  EXPECT_FALSE(started.ok()) << "the server must not serve without its metrics endpoint";
}

// A hybrid stack's KV by layer kind (ConfigureRequest.stack): one series per variant and kind,
// equal to what GetSession reports, and 0 once the session is gone.
TEST_F(MetricsTest, StackSessionsReportKvByLayerKind) {
  LayerSpec window = FindSpec("gqa2_half_bias_hd16_theta5e5").spec;
  window.sliding_window = 16;
  LayerSpec global = window;
  global.sliding_window = 0;
  v1::ConfigureRequest configure;
  for (const LayerSpec& spec : {window, window, global}) {
    *configure.mutable_stack()->add_layers() = LayerSpecToProto(spec);
  }
  configure.mutable_weights()->set_seed(1);
  v1::ConfigureResponse configured;
  grpc::Status status = attnserve::server_test::Configure(stub(), configure, &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  std::mt19937_64 rng(1);
  v1::ForwardRequest forward;
  forward.set_session_id(configured.session_id());
  *forward.add_items() = MakeForwardItem("r", RandomHidden(40, window.d_model, rng));
  v1::ForwardResponse forwarded;
  status = Forward(stub(), forward, &forwarded);
  ASSERT_TRUE(status.ok()) << Describe(status);
  v1::GetSessionRequest get;
  get.set_session_id(configured.session_id());
  v1::GetSessionResponse info;
  grpc::ClientContext context;
  SetDeadline(context);
  ASSERT_TRUE(stub().GetSession(&context, get, &info).ok());
  ASSERT_EQ(info.session().kv_by_layer_kind_size(), 2);
  const std::string variant = "gqa_swa";  // Layer 0's variant (VariantLabel).
  Exposition e = Scrape();
  for (const v1::LayerKindKv& kind : info.session().kv_by_layer_kind()) {
    EXPECT_GT(kind.kv_bytes(), 0) << kind.kind();
    EXPECT_EQ(e.Value("attnserve_kv_layer_kind_used_bytes",
                      {{"variant", variant}, {"layer_kind", kind.kind()}}),
              kind.kv_bytes())
        << kind.kind();
  }
  v1::ReleaseResponse released;
  ASSERT_TRUE(Release(stub(), configured.session_id(), "", &released).ok());
  e = Scrape();
  EXPECT_EQ(e.Value("attnserve_kv_layer_kind_used_bytes",
                    {{"variant", variant}, {"layer_kind", "global"}}),
            0);
}

}  // namespace
}  // namespace attnserve::server_test

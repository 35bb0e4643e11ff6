// Test 4 of issue 3: memory comes back. The KV pool's use (GetServerInfo.kv_pool_used_bytes)
// returns to its baseline after Release and after TTL expiry, and the server's resident memory
// does not grow across 1,000 Configure/Forward/Release cycles.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/reference/test_cases.h"
#include "tests/support/await_until.h"
#include "tests/support/server_fixture.h"

namespace attnserve::server_test {
namespace {

using reference::FindSpec;

class MemoryTest : public ServerTest {
 protected:
  int64_t PoolUsed() {
    absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub());
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->kv_pool_used_bytes() : -1;
  }

  // Polls GetServerInfo (which touches no session) until `done(info)` or `timeout`.
  template <typename Predicate>
  bool WaitForInfo(Predicate done, std::chrono::milliseconds timeout) {
    return AwaitUntil(
        [&] {
          absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub());
          return info.ok() && done(*info);
        },
        timeout, std::chrono::milliseconds(50));
  }

  std::string Session(const LayerSpec& spec) {
    v1::ConfigureResponse configured;
    grpc::Status status = Configure(stub(), SeedConfigure(spec, 1), &configured);
    EXPECT_TRUE(status.ok()) << Describe(status);
    return configured.session_id();
  }

  grpc::Status Prefill(const std::string& session, const std::string& id, int64_t tokens, int d) {
    v1::ForwardRequest request;
    request.set_session_id(session);
    *request.add_items() = MakeForwardItem(id, RandomHidden(tokens, d, rng_));
    v1::ForwardResponse response;
    return Forward(stub(), request, &response);
  }

  std::mt19937_64 rng_{3};
};

TEST_F(MemoryTest, PoolReturnsToBaselineAfterRelease) {
  const int64_t baseline = PoolUsed();
  EXPECT_EQ(baseline, 0);
  const LayerSpec gqa = FindSpec("gqa2_half_bias_hd16_theta5e5").spec;
  const LayerSpec mla = FindSpec("mla_q24_half").spec;
  const std::string s1 = Session(gqa);
  const std::string s2 = Session(mla);
  EXPECT_EQ(PoolUsed(), baseline) << "a session without requests holds no pages";

  // 40 tokens of GQA: 3 pages of 16 x 128 bytes; 70 tokens of MLA: 2 pages of 64 x 80 bytes.
  ASSERT_TRUE(Prefill(s1, "a", 40, gqa.d_model).ok());
  ASSERT_TRUE(Prefill(s1, "b", 1, gqa.d_model).ok());
  ASSERT_TRUE(Prefill(s2, "a", 70, mla.d_model).ok());
  const int64_t gqa_page = 16 * KvBytesPerToken(gqa, DType::kF32);
  const int64_t mla_page = 64 * KvBytesPerToken(mla, DType::kF32);
  EXPECT_EQ(PoolUsed(), baseline + 4 * gqa_page + 2 * mla_page);

  v1::ReleaseResponse released;
  ASSERT_TRUE(Release(stub(), s1, "a", &released).ok());
  EXPECT_EQ(released.freed_bytes(), 3 * gqa_page);
  EXPECT_EQ(PoolUsed(), baseline + gqa_page + 2 * mla_page);
  ASSERT_TRUE(Release(stub(), s2, "", &released).ok()) << "the whole session";
  EXPECT_EQ(released.freed_bytes(), 2 * mla_page);
  ASSERT_TRUE(Release(stub(), s1, "b").ok());
  EXPECT_EQ(PoolUsed(), baseline);

  absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->sessions(), 1);
  EXPECT_EQ(info->requests(), 0);
}

// GetSession's per-request kv_bytes are what the layer's pages hold (a sliding window evicts
// pages as a request grows), they add up to the session's kv_bytes_used, and cost.parameter_bytes
// is what the CPU backend keeps (fp32).
TEST_F(MemoryTest, SessionReportsTheBytesItsLayerHolds) {
  const LayerSpec spec = FindSpec("gqa2_half_window7").spec;  // Window 7, 16-token pages.
  v1::ConfigureResponse configured;
  ASSERT_TRUE(Configure(stub(), SeedConfigure(spec, 1), &configured).ok());
  EXPECT_EQ(configured.cost().parameter_bytes(), configured.cost().parameter_count() * 4);
  const std::string session = configured.session_id();
  ASSERT_TRUE(Prefill(session, "long", 65, spec.d_model).ok());
  ASSERT_TRUE(Prefill(session, "short", 5, spec.d_model).ok());

  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetSessionRequest get;
  get.set_session_id(session);
  v1::GetSessionResponse got;
  ASSERT_TRUE(stub().GetSession(&context, get, &got).ok());
  const int64_t page = 16 * KvBytesPerToken(spec, DType::kF32);
  ASSERT_EQ(got.session().requests_size(), 2);
  // "long": 65 tokens = 5 pages; the next query sees tokens > 58, so pages 0-2 were evicted.
  EXPECT_EQ(got.session().requests(0).request_id(), "long");
  EXPECT_EQ(got.session().requests(0).kv_bytes(), 2 * page);
  EXPECT_EQ(got.session().requests(1).kv_bytes(), page);
  EXPECT_EQ(got.session().kv_bytes_used(), 3 * page);
}

class TtlTest : public MemoryTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--request_ttl=1s", "--session_ttl=2s"};
  }
};

TEST_F(TtlTest, IdleRequestsAndSessionsExpireAndFreeTheirPages) {
  const int64_t baseline = PoolUsed();
  absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->limits().request_ttl_ns(), 1'000'000'000);
  EXPECT_EQ(info->limits().session_ttl_ns(), 2'000'000'000);

  const LayerSpec spec = FindSpec("gqa2_half_window7").spec;
  const std::string session = Session(spec);
  // Taken before the request's last use, so the time to its expiry is at least its TTL however
  // late this thread runs (was: taken after the Prefill, which a loaded machine could delay).
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(Prefill(session, "idle", 50, spec.d_model).ok());
  EXPECT_GT(PoolUsed(), baseline);

  // The request expires after 1 s idle (sweeps may lag: wait at most 10 s).
  EXPECT_TRUE(WaitForInfo(
      [&](const v1::GetServerInfoResponse& i) {
        return i.kv_pool_used_bytes() == baseline && i.requests() == 0;
      },
      std::chrono::seconds(10)))
      << "pool use " << PoolUsed() << " did not return to " << baseline;
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::seconds(1))
      << "expired before its TTL";
  v1::DecodeRequest decode;
  decode.set_session_id(session);
  *decode.add_items() = MakeDecodeItem("idle", RandomHidden(1, spec.d_model, rng_));
  v1::DecodeResponse ignored;
  EXPECT_EQ(Decode(stub(), decode, &ignored).error_code(), grpc::StatusCode::NOT_FOUND);

  // The session (touched by that Decode) expires 2 s later.
  EXPECT_TRUE(WaitForInfo([](const v1::GetServerInfoResponse& i) { return i.sessions() == 0; },
                          std::chrono::seconds(10)));
  EXPECT_EQ(PoolUsed(), baseline);
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetSessionRequest get;
  get.set_session_id(session);
  v1::GetSessionResponse got;
  EXPECT_EQ(stub().GetSession(&context, get, &got).error_code(), grpc::StatusCode::NOT_FOUND);

  // A request that keeps working outlives its TTL: it steps until it is 2.5 s old (past 2 TTLs
  // and several sweeps), 100 ms apart (pacing only). A step may find it expired only when the
  // time since the step before it, as this thread saw it (which bounds the server's idle time
  // from above), reached the TTL: a machine that stalled this thread that long, and then the
  // test starts again on a new request (was: steps every 300 ms, which a 700 ms stall failed).
  const std::string busy = Session(spec);
  bool outlived = false;
  for (int attempt = 0; attempt < 3 && !outlived; ++attempt) {
    const std::string id = absl::StrCat("r", attempt);
    auto last_sent = std::chrono::steady_clock::now();  // Before the request's first use.
    ASSERT_TRUE(Prefill(busy, id, 4, spec.d_model).ok());
    const auto created_by = std::chrono::steady_clock::now();
    bool expired = false;
    while (std::chrono::steady_clock::now() - created_by < std::chrono::milliseconds(2500)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      v1::DecodeRequest step;
      step.set_session_id(busy);
      *step.add_items() = MakeDecodeItem(id, RandomHidden(1, spec.d_model, rng_));
      v1::DecodeResponse response;
      const auto sent = std::chrono::steady_clock::now();
      grpc::Status status = Decode(stub(), step, &response);
      const auto answered = std::chrono::steady_clock::now();
      if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
        ASSERT_GE(answered - last_sent, std::chrono::seconds(1))
            << "request " << id << " expired while it worked: " << Describe(status);
        expired = true;
        break;
      }
      ASSERT_TRUE(status.ok()) << Describe(status);
      last_sent = sent;
    }
    outlived = !expired;
  }
  EXPECT_TRUE(outlived) << "this thread stalled past the TTL in every attempt";
}

// Resident memory across 1,000 Configure/Forward/Release cycles.
//
// The bound: after 100 warm-up cycles (allocator arenas, gRPC's per-thread caches, the thread
// pool and the KV slabs reach their working size), RSS may grow by less than 16 MiB over the next
// 1,000 cycles. A leak of one cycle's session -- its weights are 4 x 128 x 128 f32 = 256 KiB, its
// 32-token KV cache 32 KiB -- would add about 280 MiB, and a leak of only the KV pages 32 MiB, so
// either fails clearly, while allocator noise passes (measured here: +4.4 MiB after 1,000 cycles
// and +5.3 MiB after 4,000, a plateau, not a slope). A leak smaller
// than ~16 KiB per cycle (e.g. a session's bookkeeping alone) is below what this test can see.
TEST_F(MemoryTest, ResidentMemoryIsFlatOverThousandCycles) {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer keeps freed blocks in a quarantine (256 MiB by default), so resident memory
  // grows by design; in that build LeakSanitizer checks for leaks at exit instead.
  GTEST_SKIP() << "resident-memory bound not meaningful under AddressSanitizer (quarantine)";
#endif
  LayerSpec spec = FindSpec("mha_half_bias").spec;
  spec.d_model = 128;
  spec.num_heads = 8;
  spec.num_kv_heads = 8;
  spec.head_dim = 16;
  const Tensor prompt = RandomHidden(32, spec.d_model, rng_);
  const auto cycle = [&](int i) -> ::testing::AssertionResult {
    v1::ConfigureResponse configured;
    grpc::Status status = Configure(stub(), SeedConfigure(spec, i), &configured);
    if (!status.ok()) return ::testing::AssertionFailure() << "Configure: " << Describe(status);
    v1::ForwardRequest request;
    request.set_session_id(configured.session_id());
    *request.add_items() = MakeForwardItem("r", prompt);
    v1::ForwardResponse response;
    status = Forward(stub(), request, &response);
    if (!status.ok()) return ::testing::AssertionFailure() << "Forward: " << Describe(status);
    status = Release(stub(), configured.session_id(), "");
    if (!status.ok()) return ::testing::AssertionFailure() << "Release: " << Describe(status);
    return ::testing::AssertionSuccess();
  };
  constexpr int kWarmup = 100;
  constexpr int kCycles = 1000;
  constexpr int64_t kBoundBytes = 16 << 20;
  for (int i = 0; i < kWarmup; ++i) ASSERT_TRUE(cycle(i)) << "warm-up cycle " << i;
  const int64_t before = server().ResidentBytes();
  ASSERT_GT(before, 0) << "cannot read /proc/" << server().pid() << "/status";
  for (int i = 0; i < kCycles; ++i) ASSERT_TRUE(cycle(kWarmup + i)) << "cycle " << i;
  const int64_t after = server().ResidentBytes();
  RecordProperty("rss_before_bytes", std::to_string(before));
  RecordProperty("rss_after_bytes", std::to_string(after));
  EXPECT_LT(after - before, kBoundBytes)
      << "VmRSS grew from " << before << " to " << after << " bytes over " << kCycles << " cycles";
  EXPECT_EQ(PoolUsed(), 0);
  absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->sessions(), 0);
  std::cerr << "VmRSS " << before / 1024 << " KiB after warm-up, " << after / 1024 << " KiB after "
            << kCycles << " cycles\n";
}

}  // namespace
}  // namespace attnserve::server_test

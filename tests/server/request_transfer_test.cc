// Moving a request between two real server processes (ExportRequest / ImportRequest): a request
// exported mid-sequence from replica A and imported into replica B, whose session has the same
// spec and seed, decodes 16 more steps bit for bit as its unmoved twin on A (GQA, MLA, and a
// sliding window whose leading pages were evicted before the move). Every refusal has its precise
// status, and an import that fails or is cancelled half-way gives back every byte it reserved.
#include <chrono>
#include <csignal>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/codec/import_stream.h"
#include "proto/codec/tensor_codec.h"
#include "tests/reference/test_cases.h"
#include "tests/support/await_until.h"
#include "tests/support/model_session_util.h"
#include "tests/support/second_server.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using reference::FindSpec;
using ::testing::HasSubstr;

// Pages go to ImportRequest in chunks of this many bytes: several per request.
constexpr size_t kImportChunkBytes = 1000;

v1::DecodeRequest DecodeOne(const std::string& session, const std::string& request_id,
                            const Tensor& hidden) {
  v1::DecodeRequest request;
  request.set_session_id(session);
  *request.add_items() = MakeDecodeItem(request_id, hidden);
  return request;
}

// Polls (bounded: 10 s) until the pool's used bytes are `expected`; returns the last value seen.
int64_t AwaitPoolUsed(v1::AttentionService::Stub& stub, int64_t expected) {
  int64_t used = -1;
  AwaitUntil([&] { return (used = PoolUsed(stub)) == expected; }, std::chrono::seconds(10),
             std::chrono::milliseconds(50));
  return used;
}

class RequestTransferTest : public ServerTest, public ::testing::WithParamInterface<const char*> {};

// A case name: the spec's, with "+fp8" for an fp8 KV cache (scales inside each page).
v1::ConfigureRequest CaseConfigure(const std::string& name, uint64_t seed) {
  const bool fp8 = absl::EndsWith(name, "+fp8");
  v1::ConfigureRequest request =
      SeedConfigure(FindSpec(fp8 ? name.substr(0, name.size() - 4) : name).spec, seed);
  if (fp8) request.set_kv_cache_quantization(v1::KV_CACHE_QUANTIZATION_FP8_E4M3);
  return request;
}

TEST_P(RequestTransferTest, MovedRequestDecodesBitForBitAsItsUnmovedTwin) {
  const std::string name = GetParam();
  const LayerSpec spec =
      FindSpec(absl::EndsWith(name, "+fp8") ? name.substr(0, name.size() - 4) : name).spec;
  SecondServer b;
  ASSERT_TRUE(b.ok());
  v1::ConfigureResponse on_a, on_b;
  ASSERT_TRUE(Configure(stub(), CaseConfigure(name, 7), &on_a).ok());
  ASSERT_TRUE(Configure(b.stub(), CaseConfigure(name, 7), &on_b).ok());
  EXPECT_EQ(on_a.fingerprint().size(), 32u);
  EXPECT_EQ(on_a.fingerprint(), on_b.fingerprint()) << "same spec and seed on two replicas";
  const std::string sa = on_a.session_id(), sb = on_b.session_id();
  EXPECT_EQ(SessionInfoOf(stub(), sa).fingerprint(), on_a.fingerprint());

  // A: "moved" and "twin" get the same prompt (one Forward each: equal call shapes compute equal
  // bits) and the same 5 decode steps.
  std::mt19937_64 rng(11);
  const int64_t prompt_length = 37;
  const Tensor prompt = RandomHidden(prompt_length, spec.d_model, rng);
  for (const char* id : {"moved", "twin"}) {
    v1::ForwardRequest forward;
    forward.set_session_id(sa);
    *forward.add_items() = MakeForwardItem(id, prompt);
    v1::ForwardResponse forwarded;
    ASSERT_TRUE(Forward(stub(), forward, &forwarded).ok());
  }
  for (int step = 0; step < 5; ++step) {
    const Tensor hidden = RandomHidden(1, spec.d_model, rng);
    for (const char* id : {"moved", "twin"}) {
      v1::DecodeResponse decoded;
      ASSERT_TRUE(Decode(stub(), DecodeOne(sa, id, hidden), &decoded).ok());
    }
  }
  const int64_t length = prompt_length + 5;

  // Export from A (released there), in chunks that do not end on page boundaries.
  const int64_t page_bytes = on_a.cost().page_bytes();
  const int64_t chunk = page_bytes / 3 + 1;
  Exported exported;
  grpc::Status status = Export(stub(), sa, "moved", /*release=*/true, &exported, chunk);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const v1::ExportedRequest& header = exported.header;
  EXPECT_EQ(header.fingerprint(), on_a.fingerprint());
  EXPECT_EQ(header.sequence_length(), length);
  EXPECT_EQ(header.last_position(), length - 1);
  EXPECT_EQ(header.page_bytes(), page_bytes);
  const int64_t pages = (length + header.page_size() - 1) / header.page_size();
  EXPECT_EQ(header.first_held_page() + header.held_pages(), pages);
  if (spec.sliding_window > 0) {
    EXPECT_GT(header.first_held_page(), 0) << "evicted pages are not sent";
  }
  EXPECT_EQ(static_cast<int64_t>(exported.pages.size()), header.held_pages() * page_bytes);
  EXPECT_EQ(exported.chunks, (static_cast<int64_t>(exported.pages.size()) + chunk - 1) / chunk);
  v1::DecodeResponse gone;
  const Tensor probe = RandomHidden(1, spec.d_model, rng);
  EXPECT_EQ(Decode(stub(), DecodeOne(sa, "moved", probe), &gone).error_code(),
            grpc::StatusCode::NOT_FOUND)
      << "release_after_export frees the request on the source";

  // Import into B; then 16 steps on B's "moved" against A's "twin", the same inputs.
  const int64_t b_before = PoolUsed(b.stub());
  v1::ImportRequestResponse imported;
  status = Import(b.stub(), sb, "moved", header, exported.pages, &imported, kImportChunkBytes);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(imported.sequence_length(), length);
  EXPECT_EQ(imported.kv_bytes_added(), header.held_pages() * page_bytes);
  EXPECT_EQ(PoolUsed(b.stub()), b_before + header.held_pages() * page_bytes);
  for (int step = 0; step < 16; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const Tensor hidden = RandomHidden(1, spec.d_model, rng);
    v1::DecodeResponse from_b, from_a;
    status = Decode(b.stub(), DecodeOne(sb, "moved", hidden), &from_b);
    ASSERT_TRUE(status.ok()) << Describe(status);
    ASSERT_TRUE(Decode(stub(), DecodeOne(sa, "twin", hidden), &from_a).ok());
    EXPECT_EQ(from_b.results(0).sequence_length(), length + step + 1);
    ASSERT_EQ(from_b.results(0).output().data(), from_a.results(0).output().data())
        << "the moved request decoded differently from its unmoved twin";
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, RequestTransferTest,
                         ::testing::Values("gqa2_half_bias_hd16_theta5e5", "mla_q24_half",
                                           "gqa2_half_window7", "gqa2_half_bias_hd16_theta5e5+fp8"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '+' ? '_' : c;
                           return name;
                         });

class RequestTransferRefusalTest : public ServerTest {};

TEST_F(RequestTransferRefusalTest, EveryRefusalHasItsStatusAndLeaksNothing) {
  const LayerSpec spec = FindSpec("gqa2_half_bias_hd16_theta5e5").spec;
  v1::ConfigureResponse source;
  ASSERT_TRUE(Configure(stub(), SeedConfigure(spec, 7), &source).ok());
  const std::string sa = source.session_id();
  std::mt19937_64 rng(3);
  v1::ForwardRequest forward;
  forward.set_session_id(sa);
  *forward.add_items() = MakeForwardItem("r", RandomHidden(40, spec.d_model, rng));
  v1::ForwardResponse forwarded;
  ASSERT_TRUE(Forward(stub(), forward, &forwarded).ok());

  // Export: unknown session, unknown request.
  Exported ignored;
  grpc::Status status = Export(stub(), "0123456789abcdef0123456789abcdef", "r", false, &ignored);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
  status = Export(stub(), sa, "nope", false, &ignored);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("'nope' not found"));
  Exported exported;
  status = Export(stub(), sa, "r", /*release=*/false, &exported);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(exported.chunks, 1) << "the server's limit holds these few pages in one message";
  const v1::ExportedRequest& header = exported.header;
  const int64_t bytes = header.held_pages() * header.page_bytes();
  ASSERT_EQ(static_cast<int64_t>(exported.pages.size()), bytes);

  SecondServer b;
  ASSERT_TRUE(b.ok());
  v1::ConfigureResponse same, other_seed, other_page, other_dtype;
  ASSERT_TRUE(Configure(b.stub(), SeedConfigure(spec, 7), &same).ok());
  ASSERT_TRUE(Configure(b.stub(), SeedConfigure(spec, 8), &other_seed).ok());
  v1::ConfigureRequest paged = SeedConfigure(spec, 7);
  paged.set_page_size(32);
  ASSERT_TRUE(Configure(b.stub(), paged, &other_page).ok());
  v1::ConfigureRequest bf16 = SeedConfigure(spec, 7);
  bf16.set_kv_cache_dtype(v1::DTYPE_BF16);
  ASSERT_TRUE(Configure(b.stub(), bf16, &other_dtype).ok());
  v1::ConfigureResponse fp8_session, int8_session;
  v1::ConfigureRequest fp8 = SeedConfigure(spec, 7);
  fp8.set_kv_cache_quantization(v1::KV_CACHE_QUANTIZATION_FP8_E4M3);
  ASSERT_TRUE(Configure(b.stub(), fp8, &fp8_session).ok());
  v1::ConfigureRequest int8 = SeedConfigure(spec, 7);
  int8.set_kv_cache_quantization(v1::KV_CACHE_QUANTIZATION_INT8);
  ASSERT_TRUE(Configure(b.stub(), int8, &int8_session).ok());
  EXPECT_NE(fp8_session.fingerprint(), int8_session.fingerprint());
  const int64_t b_baseline = PoolUsed(b.stub());
  v1::ImportRequestResponse response;

  status = Import(b.stub(), "0123456789abcdef0123456789abcdef", "r", header, exported.pages,
                  &response, kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
  status = Import(b.stub(), other_seed.session_id(), "r", header, exported.pages, &response,
                  kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("fingerprint"));
  status = Import(b.stub(), other_page.session_id(), "r", header, exported.pages, &response,
                  kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("page_size 16 != this session's 32"));
  status = Import(b.stub(), other_dtype.session_id(), "r", header, exported.pages, &response,
                  kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("kv_format 'f32' != this session's 'bf16'"));
  // 8-bit pages of one kind into a session of the other: same bytes per page, other codes.
  v1::ForwardRequest fp8_forward;
  fp8_forward.set_session_id(fp8_session.session_id());
  *fp8_forward.add_items() = MakeForwardItem("q", RandomHidden(20, spec.d_model, rng));
  ASSERT_TRUE(Forward(b.stub(), fp8_forward, &forwarded).ok());
  Exported fp8_export;
  ASSERT_TRUE(Export(b.stub(), fp8_session.session_id(), "q", false, &fp8_export).ok());
  EXPECT_EQ(fp8_export.header.kv_format(), "fp8_e4m3");
  status = Import(b.stub(), int8_session.session_id(), "q", fp8_export.header, fp8_export.pages,
                  &response, kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("kv_format 'fp8_e4m3' != this session's 'int8'"));
  ASSERT_TRUE(Release(b.stub(), fp8_session.session_id(), "q").ok());

  // Byte counts: one short, one over, a header whose page count does not fit its length.
  const std::string sb = same.session_id();
  status =
      Import(b.stub(), sb, "r", header, exported.pages.substr(1), &response, kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat("received ", bytes - 1)));
  status = Import(b.stub(), sb, "r", header, exported.pages + "x", &response, kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("more than the"));
  v1::ExportedRequest lying = header;
  lying.set_held_pages(header.held_pages() + 1);
  status = Import(b.stub(), sb, "r", lying, exported.pages, &response, kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_EQ(AwaitPoolUsed(b.stub(), b_baseline), b_baseline) << "failed imports hold nothing";

  // A good import, then the same id again.
  status = Import(b.stub(), sb, "r", header, exported.pages, &response, kImportChunkBytes);
  ASSERT_TRUE(status.ok()) << Describe(status);
  status = Import(b.stub(), sb, "r", header, exported.pages, &response, kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << Describe(status);
  EXPECT_EQ(AwaitPoolUsed(b.stub(), b_baseline + bytes), b_baseline + bytes);

  // Cancelled half-way: the bytes reserved at the header come back.
  {
    const int64_t before = PoolUsed(b.stub());
    grpc::ClientContext context;
    SetDeadline(context);
    v1::ImportRequestResponse unused;
    std::unique_ptr<grpc::ClientWriter<v1::ImportRequestRequest>> writer =
        b.stub().ImportRequest(&context, &unused);
    v1::ImportRequestRequest message;
    message.mutable_header()->set_session_id(sb);
    message.mutable_header()->set_request_id("half");
    *message.mutable_header()->mutable_request() = header;
    ASSERT_TRUE(writer->Write(message));
    message.Clear();
    message.mutable_pages()->set_data(exported.pages.substr(0, exported.pages.size() / 2));
    ASSERT_TRUE(writer->Write(message));
    EXPECT_EQ(AwaitPoolUsed(b.stub(), before + bytes), before + bytes)
        << "the header reserves the pages' pool bytes";
    context.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_EQ(AwaitPoolUsed(b.stub(), before), before) << "a cancelled import leaks no bytes";
  }

  // Pool exhausted: a replica whose whole pool is two pages cannot take three.
  SecondServer tiny({absl::StrCat("--kv_pool_bytes=", 2 * header.page_bytes())});
  ASSERT_TRUE(tiny.ok());
  v1::ConfigureResponse small;
  ASSERT_TRUE(Configure(tiny.stub(), SeedConfigure(spec, 7), &small).ok());
  ASSERT_EQ(small.fingerprint(), source.fingerprint());
  ASSERT_EQ(header.held_pages(), 3);
  status = Import(tiny.stub(), small.session_id(), "r", header, exported.pages, &response,
                  kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("this import needs"));
  EXPECT_EQ(AwaitPoolUsed(tiny.stub(), 0), 0);

  // The source kept its request (release_after_export defaults to false).
  v1::DecodeResponse decoded;
  EXPECT_TRUE(
      Decode(stub(), DecodeOne(sa, "r", RandomHidden(1, spec.d_model, rng)), &decoded).ok());
}

// The target layer reserves an import's bytes when its header arrives (what its tokens will hold
// there), and the pages draw on them. A header that keeps pages its window would have evicted
// needs more than that: on a pool with no room for the difference the import fails at its commit,
// after every page arrived, and leaves no byte charged and no request behind.
TEST_F(RequestTransferRefusalTest, AnImportFailingMidWayLeavesNoBytesAndNoRequest) {
  const LayerSpec spec = FindSpec("gqa2_half_window7").spec;
  v1::ConfigureResponse source;
  ASSERT_TRUE(Configure(stub(), SeedConfigure(spec, 7), &source).ok());
  std::mt19937_64 rng(5);
  v1::ForwardRequest forward;
  forward.set_session_id(source.session_id());
  *forward.add_items() = MakeForwardItem("r", RandomHidden(40, spec.d_model, rng));
  v1::ForwardResponse forwarded;
  ASSERT_TRUE(Forward(stub(), forward, &forwarded).ok());
  Exported exported;
  grpc::Status status = Export(stub(), source.session_id(), "r", /*release=*/false, &exported);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const v1::ExportedRequest& header = exported.header;
  const int64_t page_bytes = header.page_bytes();
  // 40 tokens in pages of 16 with a window of 7: pages 0 and 1 evicted, page 2 held.
  ASSERT_EQ(header.first_held_page(), 2);
  ASSERT_EQ(header.held_pages(), 1);
  // The same request with its evicted pages still held (any bytes: evicted at the import).
  v1::ExportedRequest unevicted = header;
  unevicted.set_first_held_page(0);
  unevicted.set_held_pages(3);
  const std::string unevicted_pages =
      std::string(static_cast<size_t>(2 * page_bytes), '\0') + exported.pages;

  // A pool of two pages: the reservation (one page) fits; the three pages do not.
  SecondServer b({absl::StrCat("--kv_pool_bytes=", 2 * page_bytes)});
  ASSERT_TRUE(b.ok());
  v1::ConfigureResponse target;
  ASSERT_TRUE(Configure(b.stub(), SeedConfigure(spec, 7), &target).ok());
  ASSERT_EQ(target.fingerprint(), source.fingerprint());
  const std::string sb = target.session_id();
  v1::ImportRequestResponse response;
  status = Import(b.stub(), sb, "r", unevicted, unevicted_pages, &response, kImportChunkBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("this import needs"));
  EXPECT_EQ(AwaitPoolUsed(b.stub(), 0), 0) << "the reservation went back with the failed import";
  EXPECT_EQ(SessionInfoOf(b.stub(), sb).requests_size(), 0);

  // The request as its sender holds it fits the reservation exactly, and imports.
  status = Import(b.stub(), sb, "r", header, exported.pages, &response, kImportChunkBytes);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(response.kv_bytes_added(), page_bytes);
  EXPECT_EQ(AwaitPoolUsed(b.stub(), page_bytes), page_bytes);
  EXPECT_EQ(SessionInfoOf(b.stub(), sb).requests_size(), 1);
}

// --drain_to straight to a peer replica: on SIGTERM, A re-creates its sessions on B under their
// ids (one seeded, one with inline weights, which A kept to send) and moves every request; on B
// they decode bit for bit as twins configured there with the same weights and inputs.
TEST(DrainToPeerTest, SigtermMovesEverySessionAndRequestToThePeer) {
  const LayerSpec spec = FindSpec("gqa2_half_bias_hd16_theta5e5").spec;
  SecondServer b({"--replica_id=B"});
  ASSERT_TRUE(b.ok());
  SecondServer a(
      {"--replica_id=A", absl::StrCat("--drain_to=", b.address()), "--drain_timeout=20s"});
  ASSERT_TRUE(a.ok());
  v1::ConfigureRequest inline_weights = SeedConfigure(spec, 1);
  inline_weights.mutable_weights()->clear_seed();
  for (const auto& [name, tensor] : reference::TestWeights(spec, 9)) {
    v1::NamedTensor* named =
        inline_weights.mutable_weights()->mutable_inline_weights()->add_tensors();
    named->set_name(name);
    TensorToProto(tensor, named->mutable_tensor());
  }
  const std::vector<v1::ConfigureRequest> configures = {SeedConfigure(spec, 7), inline_weights};
  const std::vector<std::vector<std::string>> requests = {{"r1", "r2"}, {"q"}};
  std::vector<std::string> moved, twins;
  std::mt19937_64 rng(5);
  for (size_t s = 0; s < configures.size(); ++s) {
    v1::ConfigureResponse on_a, on_b;
    ASSERT_TRUE(Configure(a.stub(), configures[s], &on_a).ok());
    ASSERT_TRUE(Configure(b.stub(), configures[s], &on_b).ok());
    moved.push_back(on_a.session_id());
    twins.push_back(on_b.session_id());
    for (const std::string& id : requests[s]) {
      const Tensor prompt = RandomHidden(21, spec.d_model, rng);
      v1::ForwardRequest forward, twin;
      forward.set_session_id(moved.back());
      twin.set_session_id(twins.back());
      *forward.add_items() = MakeForwardItem(id, prompt);
      *twin.add_items() = MakeForwardItem(id, prompt);
      v1::ForwardResponse unused;
      ASSERT_TRUE(Forward(a.stub(), forward, &unused).ok());
      ASSERT_TRUE(Forward(b.stub(), twin, &unused).ok());
    }
  }

  absl::StatusOr<ExitState> ended = a.Terminate();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->exited && ended->exit_code == 0) << ended->ToString();
  EXPECT_THAT(a.final_log(), HasSubstr("drain: done: 2 sessions moved, 0 lost; 3 requests moved"));

  for (size_t s = 0; s < configures.size(); ++s) {
    for (int step = 0; step < 4; ++step) {
      for (const std::string& id : requests[s]) {
        SCOPED_TRACE(absl::StrCat("session ", s, " request ", id, " step ", step));
        const Tensor hidden = RandomHidden(1, spec.d_model, rng);
        v1::DecodeResponse from_moved, from_twin;
        grpc::Status status = Decode(b.stub(), DecodeOne(moved[s], id, hidden), &from_moved);
        ASSERT_TRUE(status.ok()) << Describe(status);
        ASSERT_TRUE(Decode(b.stub(), DecodeOne(twins[s], id, hidden), &from_twin).ok());
        EXPECT_EQ(from_moved.results(0).sequence_length(), 21 + step + 1);
        ASSERT_EQ(from_moved.results(0).output().data(), from_twin.results(0).output().data());
      }
    }
  }
}

// A drain whose peer never answers: while it retries (bounded by --drain_timeout) the replica
// answers session calls UNAVAILABLE saying it is draining; then it gives up, counts the requests
// lost, and still exits 0.
TEST(DrainToPeerTest, UnreachablePeerIsBoundedAndCallsMeanwhileAreUnavailable) {
  const LayerSpec spec = FindSpec("gqa2_half_bias_hd16_theta5e5").spec;
  // Port 1 on loopback: nothing listens there, every Configure is UNAVAILABLE.
  SecondServer a({"--replica_id=A", "--drain_to=127.0.0.1:1", "--drain_timeout=3s"});
  ASSERT_TRUE(a.ok());
  v1::ConfigureResponse configured;
  ASSERT_TRUE(Configure(a.stub(), SeedConfigure(spec, 7), &configured).ok());
  std::mt19937_64 rng(2);
  v1::ForwardRequest forward;
  forward.set_session_id(configured.session_id());
  *forward.add_items() = MakeForwardItem("r", RandomHidden(5, spec.d_model, rng));
  v1::ForwardResponse forwarded;
  ASSERT_TRUE(Forward(a.stub(), forward, &forwarded).ok());

  a.process().Signal(SIGTERM);
  grpc::Status status;
  AwaitUntil(  // Until the signal is seen: the first call refused.
      [&] {
        v1::DecodeResponse decoded;
        status = Decode(a.stub(),
                        DecodeOne(configured.session_id(), "r", RandomHidden(1, spec.d_model, rng)),
                        &decoded);
        return !status.ok();
      },
      std::chrono::seconds(20), std::chrono::milliseconds(20));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("replica 'A' is draining"));
  EXPECT_THAT(status.error_message(), HasSubstr("127.0.0.1:1"));

  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<ExitState> ended = a.Terminate();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->exited && ended->exit_code == 0) << ended->ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
  EXPECT_THAT(a.final_log(), HasSubstr("drain: done: 0 sessions moved, 1 lost; 0 requests moved, "
                                       "1 lost"));
}

}  // namespace
}  // namespace attnserve::server_test

// Test 3 of issue 3: every class of bad input gets its documented status code and a message that
// names the problem (docs/api.md), and the server keeps serving a well-behaved client that runs
// concurrently through every test (its outputs are checked against the engine bit for bit).
//
// Codes, as the server documents and implements them:
//   unknown session, unknown request (Decode)          NOT_FOUND
//   wrong shape / dtype UNSPECIFIED / byte count       INVALID_ARGUMENT (names items[i].hidden)
//   NaN or Inf in inputs                               INVALID_ARGUMENT (rejected, not propagated)
//   positions out of order or not after the last one   INVALID_ARGUMENT
//   sequence over --max_sequence_length                OUT_OF_RANGE
//   KV pool exhausted                                  RESOURCE_EXHAUSTED (bytes needed and free)
//   message over --max_message_bytes                   RESOURCE_EXHAUSTED (from gRPC itself)
//   inline weights of the wrong shape                  INVALID_ARGUMENT (names the tensor)
//   checkpoint path that does not exist                NOT_FOUND
//   checkpoint directory without model.safetensors     NOT_FOUND
//   checkpoint file that is corrupt (truncated header) DATA_LOSS (the safetensors reader's code;
//                                                      docs/api.md does not list it yet)
//   checkpoint file without read permission            INVALID_ARGUMENT (only checked when not
//                                                      root: root reads a chmod 000 file anyway)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/model/layer_weights.h"
#include "tests/reference/test_cases.h"
#include "tests/support/await_until.h"
#include "tests/support/server_fixture.h"

namespace attnserve::server_test {
namespace {

using reference::FindSpec;
using ::testing::HasSubstr;

constexpr int kMaxSequenceLength = 64;
constexpr int64_t kMaxMessageBytes = 256 << 10;
// The KV pool: 32 pages (64 KiB) of the GQA spec below (16 tokens x 128 bytes per page), plus one
// 10 KiB page (64 tokens x 160 bytes) for the well-behaved client's MLA session.
constexpr int64_t kTestSpecPageBytes = 16 * 128;
constexpr int64_t kGoodClientPageBytes = 64 * 160;
constexpr int64_t kPoolBytes = 32 * kTestSpecPageBytes + kGoodClientPageBytes;

// GQA (8 heads, 2 KV heads of 8) without a sliding window: a windowed layer frees pages that fall
// out of its window, which would make the pool arithmetic below depend on the window.
LayerSpec TestSpec() {
  LayerSpec spec = FindSpec("gqa2_half_window7").spec;
  spec.sliding_window = 0;
  return spec;
}

// A client that loops Forward(8 tokens) -> Decode -> Release on its own session while a test
// runs, checking every output against the engine. Started in SetUp, stopped in TearDown.
class WellBehavedClient {
 public:
  void Start(std::shared_ptr<grpc::Channel> channel) {
    stub_ = v1::AttentionService::NewStub(channel);
    const LayerSpec spec = FindSpec("mla_q0_interleaved").spec;
    v1::ConfigureResponse configured;
    grpc::Status status = Configure(*stub_, SeedConfigure(spec, 7), &configured);
    ASSERT_TRUE(status.ok()) << Describe(status);
    session_ = configured.session_id();
    // Expected outputs: the same inputs every cycle, so one reference run covers them all.
    std::mt19937_64 rng(11);
    prompt_ = RandomHidden(8, spec.d_model, rng);
    step_ = RandomHidden(1, spec.d_model, rng);
    absl::StatusOr<std::unique_ptr<ReferenceSession>> ref = ReferenceSession::Create(spec, 7);
    ASSERT_TRUE(ref.ok()) << ref.status();
    absl::StatusOr<std::vector<Tensor>> f = (*ref)->Forward({{"w", prompt_, {}}});
    absl::StatusOr<std::vector<Tensor>> d = (*ref)->Decode({{"w", step_, std::nullopt}});
    ASSERT_TRUE(f.ok() && d.ok());
    expected_forward_ = (*f)[0];
    expected_decode_ = (*d)[0];
    thread_ = std::thread([this] { Loop(); });
  }

  // Stops the loop and drops the client's stub (and with it, once the test's own stub is gone,
  // the connection); returns the first failure ("" if none) and the completed cycles.
  std::pair<std::string, int> Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    stub_.reset();
    return {failure_, cycles_.load()};
  }

  int cycles() const { return cycles_.load(); }

 private:
  void Loop() {
    while (!stop_ && failure_.empty()) {
      const std::string id = absl::StrCat("w", cycles_.load());
      v1::ForwardRequest forward;
      forward.set_session_id(session_);
      *forward.add_items() = MakeForwardItem(id, prompt_);
      v1::ForwardResponse forwarded;
      grpc::Status status = Forward(*stub_, forward, &forwarded);
      if (!status.ok()) return Fail("Forward: " + Describe(status));
      if (!SameBytes(forwarded.results(0).output(), expected_forward_))
        return Fail("Forward output");
      v1::DecodeRequest decode;
      decode.set_session_id(session_);
      *decode.add_items() = MakeDecodeItem(id, step_);
      v1::DecodeResponse decoded;
      status = Decode(*stub_, decode, &decoded);
      if (!status.ok()) return Fail("Decode: " + Describe(status));
      if (!SameBytes(decoded.results(0).output(), expected_decode_)) return Fail("Decode output");
      status = Release(*stub_, session_, id);
      if (!status.ok()) return Fail("Release: " + Describe(status));
      ++cycles_;
    }
  }
  void Fail(const std::string& what) {
    failure_ = absl::StrCat("cycle ", cycles_.load(), ": ", what);
  }

  std::unique_ptr<v1::AttentionService::Stub> stub_;
  std::string session_;
  Tensor prompt_, step_, expected_forward_, expected_decode_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> cycles_{0};
  std::string failure_;  // Written by the loop thread only; read after join.
};

class BadInputTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--max_sequence_length=", kMaxSequenceLength),
            absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
            absl::StrCat("--kv_pool_bytes=", kPoolBytes),
            // The server's temp_dir(), where CheckpointPathsThatCannotBeLoaded writes, is below it.
            absl::StrCat("--checkpoint_root=", std::filesystem::temp_directory_path().string())};
  }

  void SetUp() override {
    ServerTest::SetUp();
    if (HasFatalFailure()) return;
    good_.Start(channel_);
    if (HasFatalFailure()) return;
    v1::ConfigureResponse configured;
    grpc::Status status = Configure(stub(), SeedConfigure(TestSpec(), 3), &configured);
    ASSERT_TRUE(status.ok()) << Describe(status);
    session_ = configured.session_id();
    rng_.seed(5);
  }

  void TearDown() override {
    // Let the good client finish at least one more cycle after the bad calls.
    const int before = good_.cycles();
    AwaitUntil([&] { return good_.cycles() > before; }, std::chrono::seconds(10),
               std::chrono::milliseconds(5));
    auto [failure, cycles] = good_.Stop();
    EXPECT_EQ(failure, "") << "the well-behaved client failed";
    EXPECT_GT(cycles, before) << "the well-behaved client made no progress after the bad calls";
    ServerTest::TearDown();
  }

  Tensor Hidden(int64_t rows) { return RandomHidden(rows, TestSpec().d_model, rng_); }

  grpc::Status ForwardOne(const v1::ForwardItem& item, const std::string& session = "") {
    v1::ForwardRequest request;
    request.set_session_id(session.empty() ? session_ : session);
    *request.add_items() = item;
    v1::ForwardResponse response;
    return Forward(stub(), request, &response);
  }
  grpc::Status DecodeOne(const v1::DecodeItem& item) {
    v1::DecodeRequest request;
    request.set_session_id(session_);
    *request.add_items() = item;
    v1::DecodeResponse response;
    return Decode(stub(), request, &response);
  }
  grpc::Status ConfigureWith(const v1::WeightSource& weights) {
    v1::ConfigureRequest request = SeedConfigure(TestSpec(), 0);
    *request.mutable_weights() = weights;
    v1::ConfigureResponse response;
    return Configure(stub(), request, &response);
  }

  WellBehavedClient good_;
  std::string session_;
  std::mt19937_64 rng_;
};

#define EXPECT_STATUS(call, code, substring)                                      \
  do {                                                                            \
    const grpc::Status _status = (call);                                          \
    EXPECT_EQ(_status.error_code(), grpc::StatusCode::code) << Describe(_status); \
    EXPECT_THAT(_status.error_message(), HasSubstr(substring));                   \
  } while (false)

TEST_F(BadInputTest, UnknownSessionAndRequest) {
  const std::string unknown(32, '0');
  EXPECT_STATUS(ForwardOne(MakeForwardItem("r", Hidden(2)), unknown), NOT_FOUND,
                "session '" + unknown + "' not found");
  EXPECT_STATUS(Release(stub(), unknown, ""), NOT_FOUND, "not found");
  EXPECT_STATUS(DecodeOne(MakeDecodeItem("never", Hidden(1))), NOT_FOUND,
                "request 'never' not found");
  EXPECT_STATUS(Release(stub(), session_, "never"), NOT_FOUND, "never");
  // A released session is unknown afterwards.
  ASSERT_TRUE(Release(stub(), session_, "").ok());
  EXPECT_STATUS(ForwardOne(MakeForwardItem("r", Hidden(2))), NOT_FOUND, session_);
}

// docs/api.md: the first failing message ends a DecodeStream with that message's status; the
// responses before it stand.
TEST_F(BadInputTest, DecodeStreamEndsAtTheFirstBadStep) {
  ASSERT_TRUE(ForwardOne(MakeForwardItem("r", Hidden(3))).ok());
  grpc::ClientContext context;
  SetDeadline(context);
  auto stream = stub().DecodeStream(&context);
  for (const char* id : {"r", "unknown", "r"}) {
    v1::DecodeRequest request;
    request.set_session_id(session_);
    *request.add_items() = MakeDecodeItem(id, Hidden(1));
    if (!stream->Write(request)) break;  // The server may already have ended the stream.
  }
  stream->WritesDone();
  v1::DecodeResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_EQ(response.results(0).sequence_length(), 4);
  EXPECT_FALSE(stream->Read(&response)) << "an answer after the failing step";
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("request 'unknown' not found"));
}

TEST_F(BadInputTest, WrongShapeDtypeAndByteCount) {
  const int64_t d = TestSpec().d_model;
  // Width other than d_model.
  EXPECT_STATUS(ForwardOne(MakeForwardItem("r", RandomHidden(3, d + 1, rng_))), INVALID_ARGUMENT,
                "items[0].hidden: shape [3, 65]");
  // Rank 3.
  v1::ForwardItem rank3 = MakeForwardItem("r", Hidden(4));
  rank3.mutable_hidden()->clear_shape();
  for (int64_t dim : {int64_t{2}, int64_t{2}, d}) rank3.mutable_hidden()->add_shape(dim);
  EXPECT_STATUS(ForwardOne(rank3), INVALID_ARGUMENT, "rank");
  // Decode takes one row.
  ASSERT_TRUE(ForwardOne(MakeForwardItem("r", Hidden(3))).ok());
  EXPECT_STATUS(DecodeOne(MakeDecodeItem("r", Hidden(2))), INVALID_ARGUMENT,
                "expected [1, d_model] or [d_model]");
  // dtype UNSPECIFIED.
  v1::ForwardItem unspecified = MakeForwardItem("r", Hidden(2));
  unspecified.mutable_hidden()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_STATUS(ForwardOne(unspecified), INVALID_ARGUMENT, "dtype must be set");
  // Data shorter, and longer, than shape x dtype.
  v1::ForwardItem short_data = MakeForwardItem("r", Hidden(2));
  short_data.mutable_hidden()->mutable_data()->resize(2 * d * 4 - 1);
  EXPECT_STATUS(ForwardOne(short_data), INVALID_ARGUMENT,
                absl::StrCat("data has ", 2 * d * 4 - 1, " bytes, expected ", 2 * d * 4));
  v1::ForwardItem f16_claim = MakeForwardItem("r", Hidden(2));  // f32 bytes labelled f16
  f16_claim.mutable_hidden()->set_dtype(v1::DTYPE_F16);
  EXPECT_STATUS(ForwardOne(f16_claim), INVALID_ARGUMENT,
                absl::StrCat("data has ", 2 * d * 4, " bytes, expected ", 2 * d * 2));
  // None of that changed request "r": it still holds 3 tokens and decodes.
  v1::DecodeRequest request;
  request.set_session_id(session_);
  *request.add_items() = MakeDecodeItem("r", Hidden(1));
  v1::DecodeResponse response;
  grpc::Status status = Decode(stub(), request, &response);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(response.results(0).sequence_length(), 4);
}

TEST_F(BadInputTest, NanAndInfAreRejected) {
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  const char* const names[] = {"NaN", "+Inf", "-Inf"};
  ASSERT_TRUE(ForwardOne(MakeForwardItem("r", Hidden(2))).ok());
  for (int k = 0; k < 3; ++k) {
    Tensor hidden = Hidden(3);
    hidden.f32()[1 * TestSpec().d_model + 5] = bad_values[k];
    EXPECT_STATUS(ForwardOne(MakeForwardItem("r", hidden)), INVALID_ARGUMENT,
                  absl::StrCat("items[0].hidden: element [1, 5] is ", names[k]));
    Tensor row = Hidden(1);
    row.f32()[7] = bad_values[k];
    EXPECT_STATUS(DecodeOne(MakeDecodeItem("r", row)), INVALID_ARGUMENT,
                  absl::StrCat("element [0, 7] is ", names[k]));
    // bf16 on the wire as well.
    Tensor bf16 = hidden.CastTo(DType::kBF16);
    EXPECT_STATUS(ForwardOne(MakeForwardItem("r", bf16)), INVALID_ARGUMENT, names[k]);
  }
  // Rejected calls left "r" as it was (2 tokens).
  v1::DecodeRequest request;
  request.set_session_id(session_);
  *request.add_items() = MakeDecodeItem("r", Hidden(1));
  v1::DecodeResponse response;
  ASSERT_TRUE(Decode(stub(), request, &response).ok());
  EXPECT_EQ(response.results(0).sequence_length(), 3);
}

TEST_F(BadInputTest, PositionsOutOfOrder) {
  const std::vector<int64_t> decreasing = {0, 2, 1};
  EXPECT_STATUS(ForwardOne(MakeForwardItem("r", Hidden(3), decreasing)), INVALID_ARGUMENT,
                "positions[2] = 1, must be greater than positions[1] = 2");
  const std::vector<int64_t> repeated = {4, 4};
  EXPECT_STATUS(ForwardOne(MakeForwardItem("r", Hidden(2), repeated)), INVALID_ARGUMENT,
                "must be greater than");
  const std::vector<int64_t> negative = {-1, 0};
  EXPECT_STATUS(ForwardOne(MakeForwardItem("r", Hidden(2), negative)), INVALID_ARGUMENT,
                "must be >= 0");
  const std::vector<int64_t> too_few = {0};
  EXPECT_STATUS(ForwardOne(MakeForwardItem("r", Hidden(2), too_few)), INVALID_ARGUMENT,
                "expected one per token");
  // After 0..9, a chunk must start after 9, and a decode step too.
  const std::vector<int64_t> first = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(ForwardOne(MakeForwardItem("r", Hidden(10), first)).ok());
  const std::vector<int64_t> backwards = {9, 10};
  EXPECT_STATUS(ForwardOne(MakeForwardItem("r", Hidden(2), backwards)), INVALID_ARGUMENT,
                "must be after the last position (9)");
  EXPECT_STATUS(DecodeOne(MakeDecodeItem("r", Hidden(1), 3)), INVALID_ARGUMENT,
                "must be after the last position (9)");
  // Explicit positions that run ahead of the length forbid implicit ones afterwards.
  const std::vector<int64_t> ahead = {20, 21};
  ASSERT_TRUE(ForwardOne(MakeForwardItem("r", Hidden(2), ahead)).ok());
  EXPECT_STATUS(DecodeOne(MakeDecodeItem("r", Hidden(1))), INVALID_ARGUMENT,
                "give positions explicitly");
  EXPECT_TRUE(DecodeOne(MakeDecodeItem("r", Hidden(1), 22)).ok());
}

TEST_F(BadInputTest, SequenceOverMaxSequenceLength) {
  EXPECT_STATUS(ForwardOne(MakeForwardItem("r", Hidden(kMaxSequenceLength + 1))), OUT_OF_RANGE,
                absl::StrCat("over max_sequence_length = ", kMaxSequenceLength));
  // Exactly the limit is fine; one decode step more is not.
  ASSERT_TRUE(ForwardOne(MakeForwardItem("r", Hidden(kMaxSequenceLength - 1))).ok());
  ASSERT_TRUE(DecodeOne(MakeDecodeItem("r", Hidden(1))).ok());
  EXPECT_STATUS(DecodeOne(MakeDecodeItem("r", Hidden(1))), OUT_OF_RANGE,
                absl::StrCat("would hold ", kMaxSequenceLength + 1, " tokens"));
  EXPECT_STATUS(ForwardOne(MakeForwardItem("r", Hidden(1))), OUT_OF_RANGE, "max_sequence_length");
}

TEST_F(BadInputTest, PoolExhaustedLeavesOtherRequestsIntact) {
  // Fill the test spec's 32 pages with 8 requests of 60 tokens (4 pages each), checked against
  // the engine. Then a Forward of 3 more such requests needs 12 pages (24 KiB) while at most the
  // good client's 10 KiB page can be free: refused whatever the good client is doing.
  const LayerSpec spec = TestSpec();
  absl::StatusOr<std::unique_ptr<ReferenceSession>> ref = ReferenceSession::Create(spec, 3);
  ASSERT_TRUE(ref.ok()) << ref.status();
  constexpr int kFill = 8;
  constexpr int64_t kTokens = kMaxSequenceLength - 4;
  std::vector<std::string> held;
  for (int i = 0; i < kFill; ++i) {
    const std::string id = absl::StrCat("fill", i);
    const Tensor prompt = Hidden(kTokens);
    v1::ForwardRequest request;
    request.set_session_id(session_);
    *request.add_items() = MakeForwardItem(id, prompt);
    v1::ForwardResponse response;
    grpc::Status status = Forward(stub(), request, &response);
    ASSERT_TRUE(status.ok()) << id << ": " << Describe(status);
    absl::StatusOr<std::vector<Tensor>> expected = (*ref)->Forward({{id, prompt, {}}});
    ASSERT_TRUE(expected.ok());
    EXPECT_TRUE(SameBytes(response.results(0).output(), (*expected)[0])) << id;
    held.push_back(id);
  }
  {
    v1::ForwardRequest request;
    request.set_session_id(session_);
    for (const char* id : {"x", "y", "z"})
      *request.add_items() = MakeForwardItem(id, Hidden(kTokens));
    v1::ForwardResponse response;
    const grpc::Status status = Forward(stub(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
    // "needs 12 more pages of 16 tokens (24576 bytes), F of C pages are free" (the layer's page
    // allocator refuses first) or "needs 24576 bytes (...), F of C bytes are free" (the budget).
    EXPECT_THAT(status.error_message(), HasSubstr("exhausted"));
    EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(12 * kTestSpecPageBytes, " bytes")));
    EXPECT_THAT(status.error_message(), HasSubstr("are free"));
  }
  absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->kv_pool_capacity_bytes(), kPoolBytes);
  EXPECT_GE(info->kv_pool_used_bytes(), 32 * kTestSpecPageBytes);
  // The refused call created nothing.
  EXPECT_EQ(DecodeOne(MakeDecodeItem("x", Hidden(1))).error_code(), grpc::StatusCode::NOT_FOUND);

  // Every held request still decodes (4 tokens of room in its last page) and matches the engine,
  // which never saw the refused call.
  for (const std::string& id : held) {
    const Tensor row = Hidden(1);
    v1::DecodeRequest request;
    request.set_session_id(session_);
    *request.add_items() = MakeDecodeItem(id, row);
    v1::DecodeResponse response;
    const grpc::Status status = Decode(stub(), request, &response);
    ASSERT_TRUE(status.ok()) << id << ": " << Describe(status);
    absl::StatusOr<std::vector<Tensor>> expected = (*ref)->Decode({{id, row, std::nullopt}});
    ASSERT_TRUE(expected.ok());
    EXPECT_TRUE(SameBytes(response.results(0).output(), (*expected)[0])) << id;
  }
  // Releasing one makes room for a new one.
  ASSERT_TRUE(Release(stub(), session_, held.front()).ok());
  const grpc::Status status = ForwardOne(MakeForwardItem("after", Hidden(kTokens)));
  EXPECT_TRUE(status.ok()) << Describe(status);
}

TEST_F(BadInputTest, OversizedMessageIsRefusedByGrpc) {
  // kMaxMessageBytes of f32 rows, well over the limit.
  const int64_t rows = kMaxMessageBytes / (TestSpec().d_model * 4) + 8;
  EXPECT_STATUS(ForwardOne(MakeForwardItem("big", Hidden(rows))), RESOURCE_EXHAUSTED,
                "larger than max");
  // The connection and the session still work.
  EXPECT_TRUE(ForwardOne(MakeForwardItem("small", Hidden(4))).ok());
}

TEST_F(BadInputTest, InlineWeightsOfTheWrongShape) {
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(TestSpec(), 1);
  ASSERT_TRUE(weights.ok());
  v1::WeightSource good;
  for (const auto& [name, tensor] : *weights) {
    v1::NamedTensor* named = good.mutable_inline_weights()->add_tensors();
    named->set_name(name);
    TensorToProto(tensor, named->mutable_tensor());
  }
  // k_proj.weight transposed: [d_model, kv*hd] instead of [kv*hd, d_model].
  v1::WeightSource source = good;
  for (v1::NamedTensor& named : *source.mutable_inline_weights()->mutable_tensors()) {
    if (named.name() != "k_proj.weight") continue;
    const Tensor& k = weights->at("k_proj.weight");
    TensorToProto(Tensor(DType::kF32, {k.dim(1), k.dim(0)}), named.mutable_tensor());
  }
  EXPECT_STATUS(ConfigureWith(source), INVALID_ARGUMENT,
                "weight 'k_proj.weight' has shape [64, 16], expected [16, 64]");
  // A missing tensor, and an unexpected one.
  v1::WeightSource missing = good;
  missing.mutable_inline_weights()->mutable_tensors()->RemoveLast();
  EXPECT_STATUS(ConfigureWith(missing), INVALID_ARGUMENT, "weights.inline_weights");
  v1::WeightSource extra = good;
  v1::NamedTensor* stray = extra.mutable_inline_weights()->add_tensors();
  stray->set_name("gate_proj.weight");
  TensorToProto(Hidden(2), stray->mutable_tensor());
  EXPECT_STATUS(ConfigureWith(extra), INVALID_ARGUMENT, "gate_proj.weight");
}

TEST_F(BadInputTest, CheckpointPathsThatCannotBeLoaded) {
  const auto checkpoint = [](const std::string& path) {
    v1::WeightSource source;
    source.mutable_checkpoint()->set_path(path);
    source.mutable_checkpoint()->set_layer_index(0);
    return source;
  };
  const std::string dir = server().temp_dir();
  // Does not exist.
  EXPECT_STATUS(ConfigureWith(checkpoint(dir + "/no/such/model.safetensors")), NOT_FOUND,
                "is not a readable checkpoint under the server's checkpoint root");
  // A directory without model.safetensors (nor an index).
  const std::string empty_dir = dir + "/empty_checkpoint";
  ASSERT_EQ(mkdir(empty_dir.c_str(), 0755), 0) << std::strerror(errno);
  EXPECT_STATUS(ConfigureWith(checkpoint(empty_dir)), NOT_FOUND, "model.safetensors");
  // A corrupt file: its 8-byte header length points past the end of the file.
  const std::string corrupt = dir + "/corrupt.safetensors";
  {
    std::ofstream out(corrupt, std::ios::binary);
    const uint64_t header_length = 1000;  // little-endian on every platform we build for
    out.write(reinterpret_cast<const char*>(&header_length), sizeof(header_length));
    out << "{\"not\": \"enough\"}";
  }
  EXPECT_STATUS(ConfigureWith(checkpoint(corrupt)), DATA_LOSS, "truncated");
  // Not readable. As root (CI containers) permission bits do not stop reads, so this case only
  // runs for other users; the directory and corrupt cases above cover "unreadable" for root.
  if (geteuid() != 0) {
    const std::string locked = dir + "/locked.safetensors";
    std::ofstream(locked) << "x";
    ASSERT_EQ(chmod(locked.c_str(), 0), 0);
    EXPECT_STATUS(ConfigureWith(checkpoint(locked)), NOT_FOUND, "is not a readable checkpoint");
  }
}

}  // namespace
}  // namespace attnserve::server_test

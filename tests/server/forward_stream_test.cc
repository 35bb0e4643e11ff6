// ForwardStream against a real server whose message limit is 64 KiB (so a 1000-token prompt of
// d_model 64 in f32, 250 KiB, cannot go unary; the same shape as a 16k-token prompt at d_model
// 4096 against the default 4 MiB, at CI size). The streamed prompt's outputs are bit for bit those
// of the same rows sent as unary Forwards of 192 rows (the prefill chunk is 64 rows either way),
// and the request decodes on bit for bit as its unary twin. Every refusal has its precise status;
// a stream that fails, ends early, is cancelled or stalls (--forward_stream_idle_timeout) leaves no
// request and no KV bytes behind; a decode step of another request runs while the stream waits
// for rows, and another session cannot take the stream's reserved KV bytes meanwhile.
#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/common/client.h"
#include "client/common/forward_call.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/codec/tensor_codec.h"
#include "tests/support/await_until.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMaxMessageBytes = 64 << 10;
constexpr int64_t kChunkTokens = 64;
constexpr int64_t kPromptTokens = 1000;  // 250 KiB in f32 at d_model 64.
constexpr int64_t kUnaryRows = 192;      // A multiple of kChunkTokens under the message limit.

using Stream = grpc::ClientReaderWriter<v1::ForwardStreamRequest, v1::ForwardStreamResponse>;

// What a ForwardStream answered.
struct Answer {
  grpc::Status status;
  std::string outputs;  // Every rows message, concatenated.
  int row_messages = 0;
  bool have_summary = false;
  v1::ForwardStreamSummary summary;
};

v1::ForwardStreamRequest Header(const std::string& session, const std::string& request_id,
                                int64_t tokens, int64_t d_model,
                                v1::DType dtype = v1::DTYPE_F32) {
  v1::ForwardStreamRequest message;
  v1::ForwardStreamHeader* header = message.mutable_header();
  header->set_session_id(session);
  header->set_dtype(dtype);
  header->set_d_model(d_model);
  v1::ForwardStreamItem* item = header->add_items();
  item->set_request_id(request_id);
  item->set_num_tokens(tokens);
  return message;
}

v1::ForwardStreamRequest Rows(const std::string& bytes) {
  v1::ForwardStreamRequest message;
  message.mutable_rows()->set_data(bytes);
  return message;
}

std::string Bytes(const Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data()), t.num_bytes());
}

// Sends `messages` (then half-closes unless told not to) while reading every answer.
Answer Exchange(v1::AttentionService::Stub& stub, const std::vector<v1::ForwardStreamRequest>& sent,
                bool writes_done = true) {
  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<Stream> stream = stub.ForwardStream(&context);
  std::thread writer([&] {
    for (const v1::ForwardStreamRequest& m : sent) {
      if (!stream->Write(m)) return;
    }
    if (writes_done) stream->WritesDone();
  });
  Answer answer;
  v1::ForwardStreamResponse message;
  while (stream->Read(&message)) {
    if (message.has_rows()) {
      answer.outputs += message.rows().data();
      ++answer.row_messages;
    } else if (message.has_summary()) {
      answer.summary = message.summary();
      answer.have_summary = true;
    }
  }
  writer.join();
  answer.status = stream->Finish();
  return answer;
}

// The rows of `hidden` in messages of `rows_per_message`.
std::vector<v1::ForwardStreamRequest> RowMessages(const Tensor& hidden, int64_t rows_per_message) {
  std::vector<v1::ForwardStreamRequest> messages;
  for (int64_t row = 0; row < hidden.dim(0); row += rows_per_message) {
    messages.push_back(
        Rows(Bytes(SliceRows(hidden, row, std::min(hidden.dim(0), row + rows_per_message)))));
  }
  return messages;
}

class ForwardStreamTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    // The in-flight quota well above 4 x the limit: rows arrive in bursts of the client's HTTP/2
    // window, which gRPC buffers against that quota before the server reads them (docs/api.md).
    return {absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
            absl::StrCat("--prefill_chunk_tokens=", kChunkTokens),
            "--max_inflight_message_bytes=16777216"};
  }

  std::string Session(uint64_t seed = 7) {
    v1::ConfigureResponse configured;
    grpc::Status status = Configure(stub(), SeedConfigure(spec_, seed), &configured);
    EXPECT_TRUE(status.ok()) << Describe(status);
    return configured.session_id();
  }

  // Requests of `session` and the KV bytes it uses.
  v1::SessionInfo Info(const std::string& session) {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::GetSessionRequest request;
    request.set_session_id(session);
    v1::GetSessionResponse response;
    grpc::Status status = stub().GetSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << Describe(status);
    return response.session();
  }

  // Waits until `session` holds no request and no KV bytes (a failed stream's undo runs on the
  // session's queue, after the call may have ended).
  bool AwaitEmpty(const std::string& session) {
    return AwaitUntil(
        [&] {
          const v1::SessionInfo info = Info(session);
          return info.requests_size() == 0 && info.kv_bytes_used() == 0;
        },
        std::chrono::seconds(10));
  }

  // `hidden` as unary Forwards of kUnaryRows rows on `request_id`: the concatenated outputs.
  std::string UnaryInPieces(const std::string& session, const std::string& request_id,
                            const Tensor& hidden) {
    std::string outputs;
    for (int64_t row = 0; row < hidden.dim(0); row += kUnaryRows) {
      v1::ForwardRequest request;
      request.set_session_id(session);
      *request.add_items() = MakeForwardItem(
          request_id, SliceRows(hidden, row, std::min(hidden.dim(0), row + kUnaryRows)));
      v1::ForwardResponse response;
      grpc::Status status = Forward(stub(), request, &response);
      EXPECT_TRUE(status.ok()) << Describe(status);
      if (!status.ok()) return "";
      outputs += response.results(0).output().data();
    }
    return outputs;
  }

  std::string DecodeOnce(const std::string& session, const std::string& request_id,
                         const Tensor& row) {
    v1::DecodeRequest request;
    request.set_session_id(session);
    *request.add_items() = MakeDecodeItem(request_id, row);
    v1::DecodeResponse response;
    grpc::Status status = Decode(stub(), request, &response);
    EXPECT_TRUE(status.ok()) << Describe(status);
    return status.ok() ? response.results(0).output().data() : "";
  }

  const LayerSpec spec_ = SmallBiasedGqa();
  std::mt19937_64 rng_{42};
};

TEST_F(ForwardStreamTest, LongPromptMatchesUnaryForwardsBitForBit) {
  const std::string session = Session();
  const Tensor prompt = RandomHidden(kPromptTokens, spec_.d_model, rng_);
  ASSERT_GT(static_cast<int64_t>(prompt.num_bytes()), kMaxMessageBytes);
  const std::string expected = UnaryInPieces(session, "unary", prompt);
  ASSERT_EQ(expected.size(), prompt.num_bytes());

  // 100-row messages (25 KiB): chunks of 64 rows cut across them.
  std::vector<v1::ForwardStreamRequest> sent = {
      Header(session, "streamed", kPromptTokens, spec_.d_model)};
  for (v1::ForwardStreamRequest& m : RowMessages(prompt, 100)) sent.push_back(std::move(m));
  const Answer answer = Exchange(stub(), sent);
  ASSERT_TRUE(answer.status.ok()) << Describe(answer.status);
  ASSERT_TRUE(answer.have_summary);
  EXPECT_TRUE(answer.outputs == expected) << "streamed outputs differ from the unary ones";
  ASSERT_EQ(answer.summary.results_size(), 1);
  EXPECT_EQ(answer.summary.results(0).request_id(), "streamed");
  EXPECT_EQ(answer.summary.results(0).num_tokens(), kPromptTokens);
  EXPECT_EQ(answer.summary.results(0).sequence_length(), kPromptTokens);
  EXPECT_EQ(answer.summary.prefill_chunks(), (kPromptTokens + kChunkTokens - 1) / kChunkTokens);
  EXPECT_GT(answer.row_messages, 1);  // Outputs streamed back chunk by chunk.

  // Both decode on alike.
  for (int step = 0; step < 4; ++step) {
    const Tensor row = RandomHidden(1, spec_.d_model, rng_);
    EXPECT_EQ(DecodeOnce(session, "streamed", row), DecodeOnce(session, "unary", row))
        << "step " << step;
  }
  // Unary, the prompt is refused whole for its size (gRPC's own limit on the server's side).
  // Last: the refused bytes count against the server's in-flight quota for a moment.
  v1::ForwardRequest request;
  request.set_session_id(session);
  *request.add_items() = MakeForwardItem("whole", prompt);
  v1::ForwardResponse response;
  EXPECT_EQ(Forward(stub(), request, &response).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(ForwardStreamTest, ClientHelperStreamsWhatDoesNotFitAndMatchesUnary) {
  // Two items with explicit positions for the second, through the client library's CallForward,
  // which picks ForwardStream because the request passes the server's limit.
  const std::string session = Session();
  const Tensor a = RandomHidden(700, spec_.d_model, rng_);
  const Tensor b = RandomHidden(300, spec_.d_model, rng_);
  std::vector<int64_t> b_positions;
  for (int64_t t = 0; t < b.dim(0); ++t) b_positions.push_back(1000 + 2 * t);
  v1::ForwardRequest request;
  request.set_session_id(session);
  *request.add_items() = MakeForwardItem("a", a);
  *request.add_items() = MakeForwardItem("b", b, b_positions);

  Client client = MakeClient(server().address(), absl::Seconds(30), false);
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::ForwardResponse streamed;
  grpc::Status status = CallForward(client, &context, request, &streamed);
  ASSERT_TRUE(status.ok()) << Describe(status);
  ASSERT_EQ(streamed.results_size(), 2);

  // The first item's rows as unary Forwards in a second session of the same seed. Its first 640
  // rows ran in chunks of its own rows alone (the 11th chunk also holds b's first rows, an engine
  // call of another shape), so those are compared bit for bit.
  const std::string twin = Session();
  const size_t exact_bytes = 640 * spec_.d_model * sizeof(float);
  const std::string unary_a = UnaryInPieces(twin, "a", a);
  ASSERT_EQ(streamed.results(0).output().data().size(), unary_a.size());
  EXPECT_TRUE(streamed.results(0).output().data().substr(0, exact_bytes) ==
              unary_a.substr(0, exact_bytes));
  EXPECT_EQ(streamed.results(0).sequence_length(), 700);
  EXPECT_EQ(streamed.results(1).sequence_length(), 300);
  EXPECT_EQ(streamed.results(1).output().shape(0), 300);
  EXPECT_EQ(Info(session).requests_size(), 2);
}

TEST_F(ForwardStreamTest, RefusesWithPreciseStatuses) {
  const std::string session = Session();
  const Tensor rows = RandomHidden(10, spec_.d_model, rng_);
  const std::string ten = Bytes(rows);

  // Unknown session.
  EXPECT_EQ(Exchange(stub(), {Header("0123456789abcdef0123456789abcdef", "x", 10, spec_.d_model),
                              Rows(ten)})
                .status.error_code(),
            grpc::StatusCode::NOT_FOUND);
  // Rows before the header.
  Answer a = Exchange(stub(), {Rows(ten)});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("header"));
  // Wrong d_model.
  a = Exchange(stub(), {Header(session, "x", 10, spec_.d_model + 1), Rows(ten)});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("d_model"));
  // No dtype.
  a = Exchange(stub(), {Header(session, "x", 10, spec_.d_model, v1::DTYPE_UNSPECIFIED)});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("dtype"));
  // Rows of another width: not a whole number of rows.
  a = Exchange(stub(), {Header(session, "x", 10, spec_.d_model), Rows(ten.substr(0, 100))});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("whole number"));
  // More rows than announced.
  a = Exchange(stub(), {Header(session, "x", 5, spec_.d_model), Rows(ten)});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("more than"));
  // Ended early.
  a = Exchange(stub(), {Header(session, "x", 20, spec_.d_model), Rows(ten)});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(a.status.error_message(), HasSubstr("ended after 10 of the 20"));
  // Longer than the session allows.
  a = Exchange(stub(), {Header(session, "x", int64_t{1} << 40, spec_.d_model)});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  // A non-finite value.
  Tensor bad = rows;
  reinterpret_cast<float*>(bad.data())[3] = std::numeric_limits<float>::quiet_NaN();
  a = Exchange(stub(), {Header(session, "x", 10, spec_.d_model), Rows(Bytes(bad))});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(AwaitEmpty(session)) << "a refused stream left state behind";

  // An existing request: ALREADY_EXISTS (a stream only creates requests).
  a = Exchange(stub(), {Header(session, "x", 10, spec_.d_model), Rows(ten)});
  ASSERT_TRUE(a.status.ok()) << Describe(a.status);
  a = Exchange(stub(), {Header(session, "x", 10, spec_.d_model), Rows(ten)});
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Info(session).requests(0).sequence_length(), 10);
}

TEST_F(ForwardStreamTest, CancelledStreamLeavesNothingAndOthersDecodeMeanwhile) {
  const std::string session = Session();
  const std::string other = "other";
  ASSERT_FALSE(UnaryInPieces(session, other, RandomHidden(16, spec_.d_model, rng_)).empty());
  const int64_t other_bytes = Info(session).kv_bytes_used();
  const Tensor prompt = RandomHidden(kPromptTokens, spec_.d_model, rng_);

  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<Stream> stream = stub().ForwardStream(&context);
  ASSERT_TRUE(stream->Write(Header(session, "long", kPromptTokens, spec_.d_model)));
  ASSERT_TRUE(stream->Write(Rows(Bytes(SliceRows(prompt, 0, 200)))));
  // The first turn reserved the whole prompt's pages and ran the rows that came.
  ASSERT_TRUE(AwaitUntil([&] { return Info(session).kv_bytes_used() > other_bytes; },
                         std::chrono::seconds(10)));
  // The stream waits for rows; another request decodes meanwhile.
  EXPECT_FALSE(DecodeOnce(session, other, RandomHidden(1, spec_.d_model, rng_)).empty());

  context.TryCancel();
  v1::ForwardStreamResponse message;
  while (stream->Read(&message)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Undone: only the other request remains, and the session holds its pages alone (one more
  // than before: its decode step began a second page).
  EXPECT_TRUE(AwaitUntil(
      [&] {
        const v1::SessionInfo info = Info(session);
        return info.requests_size() == 1 && info.requests(0).request_id() == other &&
               info.kv_bytes_used() == info.requests(0).kv_bytes();
      },
      std::chrono::seconds(10)))
      << "the cancelled stream's request or pages are still held";
  EXPECT_FALSE(DecodeOnce(session, other, RandomHidden(1, spec_.d_model, rng_)).empty());
}

// --forward_stream_idle_timeout, short here: a stalled stream's op holds the session's later ops.
class ForwardStreamIdleTest : public ForwardStreamTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    std::vector<std::string> flags = ForwardStreamTest::ExtraFlags();
    flags.push_back("--forward_stream_idle_timeout=1s");
    return flags;
  }
};

// A stream that stalls (its header and 200 of 1000 rows, then silence: neither the rest, nor a
// half-close, nor a cancel) is ended DEADLINE_EXCEEDED naming the flag once it has been silent
// for the idle timeout, and undone: its request, pages and reservation are released, and the
// Forward queued behind it on the session runs. Each wait is for the server's own answer or
// counters, never a sleep.
TEST_F(ForwardStreamIdleTest, StalledStreamIsEndedAndReleasesItsRequests) {
  const std::string session = Session();
  ASSERT_FALSE(UnaryInPieces(session, "other", RandomHidden(16, spec_.d_model, rng_)).empty());
  const int64_t other_bytes = Info(session).kv_bytes_used();
  const Tensor prompt = RandomHidden(kPromptTokens, spec_.d_model, rng_);

  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<Stream> stream = stub().ForwardStream(&context);
  ASSERT_TRUE(stream->Write(Header(session, "stalled", kPromptTokens, spec_.d_model)));
  ASSERT_TRUE(stream->Write(Rows(Bytes(SliceRows(prompt, 0, 200)))));
  // The op's first turn reserved the prompt's pages: it is on the session's queue.
  ASSERT_TRUE(AwaitUntil([&] { return Info(session).kv_bytes_used() > other_bytes; },
                         std::chrono::seconds(10)));
  // A Forward of a new request: an op, so it waits until the stalled stream's op is over.
  grpc::Status behind_status;
  std::thread behind([&] {
    v1::ForwardRequest request;
    request.set_session_id(session);
    *request.add_items() = MakeForwardItem("next", RandomHidden(16, spec_.d_model, rng_));
    v1::ForwardResponse response;
    behind_status = Forward(stub(), request, &response);
  });

  v1::ForwardStreamResponse message;
  while (stream->Read(&message)) {
  }
  const grpc::Status ended = stream->Finish();
  behind.join();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << Describe(ended);
  EXPECT_THAT(ended.error_message(),
              HasSubstr("ForwardStream: no message for 1s (--forward_stream_idle_timeout) with "
                        "200 of the 1000 announced rows received; the Forward is abandoned and "
                        "every request it created released"));
  EXPECT_TRUE(behind_status.ok()) << "the Forward behind the stalled stream: "
                                  << Describe(behind_status);
  // Undone: "other" and "next" remain, holding the session's pages alone.
  EXPECT_TRUE(AwaitUntil(
      [&] {
        const v1::SessionInfo info = Info(session);
        int64_t held = 0;
        for (const auto& request : info.requests()) {
          if (request.request_id() == "stalled") return false;
          held += request.kv_bytes();
        }
        return info.requests_size() == 2 && info.kv_bytes_used() == held;
      },
      std::chrono::seconds(10)))
      << "the stalled stream's request or pages are still held";

  // A stream that never sends its header ends the same way (it holds no op, only the call).
  grpc::ClientContext silent_context;
  SetDeadline(silent_context);
  std::unique_ptr<Stream> silent = stub().ForwardStream(&silent_context);
  while (silent->Read(&message)) {
  }
  const grpc::Status silent_end = silent->Finish();
  EXPECT_EQ(silent_end.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << Describe(silent_end);
  EXPECT_THAT(silent_end.error_message(), HasSubstr("with the header not yet sent"));
}

class ForwardStreamPoolTest : public ForwardStreamTest {
 protected:
  // 32 pages of 4 KiB: 512 tokens of the small GQA layer.
  std::vector<std::string> ExtraFlags() const override {
    std::vector<std::string> flags = ForwardStreamTest::ExtraFlags();
    flags.push_back("--kv_pool_bytes=131072");
    return flags;
  }
};

TEST_F(ForwardStreamPoolTest, PromptThatCannotFitIsRefusedBeforeItsRows) {
  const std::string session = Session();
  // Only the header: the refusal comes from the reservation, before any row is sent.
  const Answer answer =
      Exchange(stub(), {Header(session, "big", kPromptTokens, spec_.d_model)}, false);
  EXPECT_EQ(answer.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << Describe(answer.status);
  EXPECT_TRUE(AwaitEmpty(session));
}

// A stream's reservation is its own between two chunks: while the stream waits for rows, another
// session's Forward that needs the reserved bytes is refused and one that fits beside them runs;
// then the stream finishes with every row. (The reservation is charged once, held by the stream's
// sequence in the layer's KV ledger, and each chunk's pages draw on it: nothing is released for
// another charge to take.)
TEST_F(ForwardStreamPoolTest, AnotherSessionCannotTakeTheReservedBytesBetweenChunks) {
  const std::string streamed = Session();
  const std::string other = Session(8);
  constexpr int64_t kPageTokens = 16;  // 4 KiB pages of the small GQA layer.
  constexpr int64_t kTokens = 448;     // 28 of the pool's 32 pages.
  const Tensor prompt = RandomHidden(kTokens, spec_.d_model, rng_);

  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<Stream> stream = stub().ForwardStream(&context);
  ASSERT_TRUE(stream->Write(Header(streamed, "long", kTokens, spec_.d_model)));
  ASSERT_TRUE(stream->Write(Rows(Bytes(SliceRows(prompt, 0, 100)))));
  // The first chunk's output is back: the whole prompt is reserved (on the stream's first turn),
  // and the stream waits for the rest of its rows.
  v1::ForwardStreamResponse message;
  ASSERT_TRUE(stream->Read(&message));
  ASSERT_TRUE(message.has_rows());
  std::string outputs = message.rows().data();

  const auto forward_other = [&](const std::string& request_id, int64_t tokens) {
    v1::ForwardRequest request;
    request.set_session_id(other);
    *request.add_items() = MakeForwardItem(request_id, RandomHidden(tokens, spec_.d_model, rng_));
    v1::ForwardResponse response;
    return Forward(stub(), request, &response);
  };
  // 5 pages do not fit beside the 28 reserved; 4 do.
  const grpc::Status refused = forward_other("too_big", 5 * kPageTokens);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(refused);
  EXPECT_THAT(refused.error_message(), HasSubstr("KV memory budget exhausted"));
  const grpc::Status fits = forward_other("fits", 4 * kPageTokens);
  EXPECT_TRUE(fits.ok()) << Describe(fits);

  for (v1::ForwardStreamRequest& m : RowMessages(SliceRows(prompt, 100, kTokens), 100)) {
    ASSERT_TRUE(stream->Write(m));
  }
  ASSERT_TRUE(stream->WritesDone());
  bool have_summary = false;
  v1::ForwardStreamSummary summary;
  while (stream->Read(&message)) {
    if (message.has_rows()) outputs += message.rows().data();
    if (message.has_summary()) {
      summary = message.summary();
      have_summary = true;
    }
  }
  const grpc::Status status = stream->Finish();
  ASSERT_TRUE(status.ok()) << Describe(status);
  ASSERT_TRUE(have_summary);
  EXPECT_EQ(static_cast<int64_t>(outputs.size()), kTokens * spec_.d_model * 4);
  ASSERT_EQ(summary.results_size(), 1);
  EXPECT_EQ(summary.results(0).sequence_length(), kTokens);
  EXPECT_EQ(Info(streamed).kv_bytes_used(), kTokens / kPageTokens * 4096);
}

}  // namespace
}  // namespace attnserve::server_test

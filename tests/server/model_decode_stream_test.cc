// A model session's decode over one DecodeStream (docs/remote_model.md, "Decode over a stream"):
// one message per layer per step, each carrying every request of the step. Checked against the
// same steps sent as unary per-layer Decode calls to a twin session (same seed): every answer
// bit for bit, in f32 and with bf16 on the wire over bf16 KV pages. A layer out of order or a bad
// message ends the stream with that message's status and changes nothing (the step goes on, on a
// new stream, where it stopped); a stream cancelled mid-step leaves each request at a layer
// GetSession reports, from which the step continues.
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/model_session_util.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 3;
constexpr uint64_t kSeed = 21;
constexpr int64_t kDModel = 64;
constexpr int64_t kPrompt = 12;
const std::vector<std::string> kRequests = {"a", "b", "c"};

// SmallBiasedGqa three times, the first with a sliding window of 8 tokens (crossed by the steps).
v1::ConfigureRequest ModelConfigure(DType kv_dtype) {
  std::vector<LayerSpec> specs(kLayers, SmallBiasedGqa());
  specs[0].sliding_window = 8;
  v1::ConfigureRequest request = ModelConfigureRequest(specs, kSeed);
  request.set_kv_cache_dtype(DTypeToProto(kv_dtype));
  return request;
}

// One layer's message of a step: every request's row (rows[i] for kRequests[i]) and position.
v1::DecodeRequest StepMessage(const std::string& session, int layer,
                              const std::vector<Tensor>& rows, int64_t position) {
  v1::DecodeRequest request;
  request.set_session_id(session);
  request.set_layer(layer);
  for (size_t i = 0; i < rows.size(); ++i) {
    *request.add_items() = MakeDecodeItem(kRequests[i], rows[i], position);
  }
  return request;
}

// Each request's (sequence_length, next_layer), in kRequests order; (-1, -1) when absent.
std::vector<std::pair<int64_t, int>> States(v1::AttentionService::Stub& stub,
                                            const std::string& session) {
  std::vector<std::pair<int64_t, int>> states(kRequests.size(), {-1, -1});
  const v1::SessionInfo info = SessionInfoOf(stub, session);
  for (const v1::RequestInfo& r : info.requests()) {
    for (size_t i = 0; i < kRequests.size(); ++i) {
      if (r.request_id() == kRequests[i]) states[i] = {r.sequence_length(), r.next_layer()};
    }
  }
  return states;
}

std::vector<std::pair<int64_t, int>> AllAt(int64_t length, int next_layer) {
  return std::vector<std::pair<int64_t, int>>(kRequests.size(), {length, next_layer});
}

class ModelDecodeStreamTest : public ServerTest {
 protected:
  // A model session with every request prefilled (kPrompt tokens, the same rows on every layer).
  std::string PrefilledModel(DType kv_dtype, DType wire, std::mt19937_64& rng) {
    v1::ConfigureResponse configured;
    const grpc::Status status = Configure(stub(), ModelConfigure(kv_dtype), &configured);
    EXPECT_TRUE(status.ok()) << Describe(status);
    const std::string session = configured.session_id();
    for (int k = 0; k < kLayers; ++k) {
      v1::ForwardRequest forward;
      forward.set_session_id(session);
      forward.set_layer(k);
      for (const std::string& id : kRequests) {
        *forward.add_items() = MakeForwardItem(id, RandomHidden(kPrompt, kDModel, rng, wire));
      }
      v1::ForwardResponse response;
      const grpc::Status forwarded = Forward(stub(), forward, &response);
      EXPECT_TRUE(forwarded.ok()) << "layer " << k << ": " << Describe(forwarded);
    }
    return session;
  }

  // Sends `message` on `stream` and reads its answer; false when the stream ended first (its
  // status is then Finish()'s).
  static bool Exchange(grpc::ClientReaderWriter<v1::DecodeRequest, v1::DecodeResponse>& stream,
                       const v1::DecodeRequest& message, v1::DecodeResponse* response) {
    return stream.Write(message) && stream.Read(response);
  }
};

struct WireCase {
  DType kv_dtype;
  DType wire;
};

// For gtest's test names and messages (not "2-byte object <00-00>").
void PrintTo(const WireCase& c, std::ostream* os) {
  *os << "kv " << DTypeName(c.kv_dtype) << ", wire " << DTypeName(c.wire);
}

class ModelDecodeStreamEqualsUnaryTest : public ModelDecodeStreamTest,
                                         public ::testing::WithParamInterface<WireCase> {};

// Two twin sessions (same seed, same prompts): one decodes with unary per-layer Decode calls, the
// other over one stream, with the same rows. Every answer is byte-identical (the same engine calls:
// one per layer per step, the 3 requests batched in each), in the wire dtype.
TEST_P(ModelDecodeStreamEqualsUnaryTest, EveryLayerOfEveryStepBitForBit) {
  const WireCase param = GetParam();
  std::mt19937_64 rng_unary(3), rng_stream(3);
  const std::string unary = PrefilledModel(param.kv_dtype, param.wire, rng_unary);
  const std::string streamed = PrefilledModel(param.kv_dtype, param.wire, rng_stream);
  ASSERT_FALSE(unary.empty());
  ASSERT_FALSE(streamed.empty());

  constexpr int kSteps = 6;  // Past the window of layer 0 (8 tokens) from 12 to 18.
  std::mt19937_64 rng(17);
  std::vector<std::vector<std::vector<Tensor>>> rows(kSteps);  // [step][layer][request]
  std::vector<std::vector<v1::DecodeResponse>> unary_answers(kSteps);
  for (int step = 0; step < kSteps; ++step) {
    for (int k = 0; k < kLayers; ++k) {
      std::vector<Tensor> layer_rows;
      for (size_t i = 0; i < kRequests.size(); ++i) {
        layer_rows.push_back(RandomHidden(1, kDModel, rng, param.wire));
      }
      v1::DecodeResponse response;
      const grpc::Status status =
          Decode(stub(), StepMessage(unary, k, layer_rows, kPrompt + step), &response);
      ASSERT_TRUE(status.ok()) << "step " << step << " layer " << k << ": " << Describe(status);
      rows[step].push_back(std::move(layer_rows));
      unary_answers[step].push_back(std::move(response));
    }
  }

  grpc::ClientContext context;
  SetDeadline(context);
  auto stream = stub().DecodeStream(&context);
  for (int step = 0; step < kSteps; ++step) {
    for (int k = 0; k < kLayers; ++k) {
      v1::DecodeResponse response;
      ASSERT_TRUE(
          Exchange(*stream, StepMessage(streamed, k, rows[step][k], kPrompt + step), &response))
          << "step " << step << " layer " << k << ": " << Describe(stream->Finish());
      const v1::DecodeResponse& expected = unary_answers[step][k];
      ASSERT_EQ(response.results_size(), static_cast<int>(kRequests.size()));
      for (int i = 0; i < response.results_size(); ++i) {
        EXPECT_EQ(response.results(i).request_id(), kRequests[i]);
        EXPECT_EQ(response.results(i).output().dtype(), DTypeToProto(param.wire));
        EXPECT_EQ(response.results(i).output().data(), expected.results(i).output().data())
            << "step " << step << " layer " << k << " request " << kRequests[i];
        EXPECT_EQ(response.results(i).sequence_length(), kPrompt + step + 1);
      }
      // Layer 0 starts the step for every request; the others follow it.
      EXPECT_EQ(States(stub(), streamed), AllAt(kPrompt + step + 1, (k + 1) % kLayers));
    }
  }
  ASSERT_TRUE(stream->WritesDone());
  const grpc::Status finished = stream->Finish();
  EXPECT_TRUE(finished.ok()) << Describe(finished);
  EXPECT_EQ(States(stub(), streamed), States(stub(), unary));
  EXPECT_EQ(SessionInfoOf(stub(), streamed).kv_bytes_used(), SessionInfoOf(stub(), unary).kv_bytes_used());
}

INSTANTIATE_TEST_SUITE_P(Wire, ModelDecodeStreamEqualsUnaryTest,
                         ::testing::Values(WireCase{DType::kF32, DType::kF32},
                                           WireCase{DType::kBF16, DType::kBF16}),
                         [](const ::testing::TestParamInfo<WireCase>& info) {
                           return absl::StrCat("kv_", DTypeName(info.param.kv_dtype), "_wire_",
                                               DTypeName(info.param.wire));
                         });

// Layer 0 of a step, then layer 2: the stream ends FAILED_PRECONDITION naming the layer and
// request; every request is still at layer 1 with the same KV bytes, and a new stream goes on.
TEST_F(ModelDecodeStreamTest, LayerOutOfOrderEndsTheStreamWithNothingChanged) {
  std::mt19937_64 rng(5);
  const std::string session = PrefilledModel(DType::kF32, DType::kF32, rng);
  const auto rows = [&rng] {
    std::vector<Tensor> r;
    for (size_t i = 0; i < kRequests.size(); ++i) r.push_back(RandomHidden(1, kDModel, rng));
    return r;
  };
  {
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub().DecodeStream(&context);
    v1::DecodeResponse response;
    ASSERT_TRUE(Exchange(*stream, StepMessage(session, 0, rows(), kPrompt), &response));
    EXPECT_EQ(States(stub(), session), AllAt(kPrompt + 1, 1));
    const int64_t used = SessionInfoOf(stub(), session).kv_bytes_used();
    // The server ends the stream on this message: its write may or may not see the end first.
    stream->Write(StepMessage(session, 2, rows(), kPrompt));
    EXPECT_FALSE(stream->Read(&response)) << "an answer to the message out of order";
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
    EXPECT_THAT(status.error_message(), HasSubstr("layer 2 of request 'a' out of order"));
    EXPECT_THAT(status.error_message(), HasSubstr("runs layer 1 next"));
    EXPECT_EQ(States(stub(), session), AllAt(kPrompt + 1, 1));
    EXPECT_EQ(SessionInfoOf(stub(), session).kv_bytes_used(), used);
  }
  // A layer 0 again while the step is in flight is refused the same way.
  {
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub().DecodeStream(&context);
    v1::DecodeResponse response;
    EXPECT_FALSE(Exchange(*stream, StepMessage(session, 0, rows(), kPrompt + 1), &response));
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
    EXPECT_THAT(status.error_message(), HasSubstr("starts a new step"));
    EXPECT_EQ(States(stub(), session), AllAt(kPrompt + 1, 1));
  }
  grpc::ClientContext context;
  SetDeadline(context);
  auto stream = stub().DecodeStream(&context);
  v1::DecodeResponse response;
  // The step in flight (positions from kPrompt) at layers 1 and 2, then a whole new step.
  const std::vector<std::pair<int, int64_t>> messages = {
      {1, kPrompt}, {2, kPrompt}, {0, kPrompt + 1}, {1, kPrompt + 1}, {2, kPrompt + 1}};
  for (const auto& [k, position] : messages) {
    ASSERT_TRUE(Exchange(*stream, StepMessage(session, k, rows(), position), &response))
        << "layer " << k << ": " << Describe(stream->Finish());
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(States(stub(), session), AllAt(kPrompt + 2, 0));
}

// Messages that fail their checks, each on its own stream mid-step: the stream ends with the
// message's status naming the field; the requests stay where they were (a message is
// all-or-nothing: one bad item fails the others with it).
TEST_F(ModelDecodeStreamTest, BadMessageEndsTheStreamWithNothingChanged) {
  std::mt19937_64 rng(8);
  const std::string session = PrefilledModel(DType::kF32, DType::kF32, rng);
  std::vector<Tensor> good;
  for (size_t i = 0; i < kRequests.size(); ++i) good.push_back(RandomHidden(1, kDModel, rng));
  v1::DecodeResponse response;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub().DecodeStream(&context);
    ASSERT_TRUE(Exchange(*stream, StepMessage(session, 0, good, kPrompt), &response));
    ASSERT_TRUE(stream->WritesDone());
    ASSERT_TRUE(stream->Finish().ok());
  }
  const int64_t used = SessionInfoOf(stub(), session).kv_bytes_used();

  struct BadCase {
    std::string name;
    v1::DecodeRequest message;
    grpc::StatusCode code;
    std::string says;
  };
  std::vector<BadCase> cases;
  {
    v1::DecodeRequest m = StepMessage(session, 1, good, kPrompt);
    *m.mutable_items(1)->mutable_hidden() =
        MakeDecodeItem("b", RandomHidden(1, kDModel + 1, rng)).hidden();
    cases.push_back({"width", m, grpc::StatusCode::INVALID_ARGUMENT, "items[1].hidden: shape"});
  }
  {
    v1::DecodeRequest m = StepMessage(session, 1, good, kPrompt);
    Tensor nan = good[2];
    reinterpret_cast<float*>(nan.data())[5] = std::numeric_limits<float>::quiet_NaN();
    *m.mutable_items(2)->mutable_hidden() = MakeDecodeItem("c", nan).hidden();
    cases.push_back({"nan", m, grpc::StatusCode::INVALID_ARGUMENT, "items[2].hidden: element"});
  }
  {
    v1::DecodeRequest m = StepMessage(session, 1, good, kPrompt);
    m.mutable_items(2)->set_request_id("a");
    cases.push_back({"repeated id", m, grpc::StatusCode::INVALID_ARGUMENT, "repeats items[0]"});
  }
  {
    v1::DecodeRequest m = StepMessage(session, 1, good, kPrompt);
    m.mutable_items(1)->set_request_id("unknown");
    cases.push_back({"unknown request", m, grpc::StatusCode::FAILED_PRECONDITION,
                     "request 'unknown': the request is not in model session"});
  }
  {
    v1::DecodeRequest m = StepMessage(session, 1, good, kPrompt);
    m.mutable_items(0)->set_position(kPrompt + 1);
    cases.push_back({"other position", m, grpc::StatusCode::FAILED_PRECONDITION,
                     "positions differ from its step's"});
  }
  {
    v1::DecodeRequest m = StepMessage(session, kLayers, good, kPrompt);
    cases.push_back({"layer range", m, grpc::StatusCode::INVALID_ARGUMENT, "out of range"});
  }
  {
    v1::DecodeRequest m = StepMessage("no-such-session", 1, good, kPrompt);
    cases.push_back({"session", m, grpc::StatusCode::NOT_FOUND, "no-such-session"});
  }
  for (const BadCase& c : cases) {
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub().DecodeStream(&context);
    EXPECT_FALSE(Exchange(*stream, c.message, &response)) << c.name;
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), c.code) << c.name << ": " << Describe(status);
    EXPECT_THAT(status.error_message(), HasSubstr(c.says)) << c.name;
    EXPECT_EQ(States(stub(), session), AllAt(kPrompt + 1, 1)) << c.name;
    EXPECT_EQ(SessionInfoOf(stub(), session).kv_bytes_used(), used) << c.name;
  }
  // The step goes on with the good rows.
  grpc::ClientContext context;
  SetDeadline(context);
  auto stream = stub().DecodeStream(&context);
  ASSERT_TRUE(Exchange(*stream, StepMessage(session, 1, good, kPrompt), &response));
  ASSERT_TRUE(Exchange(*stream, StepMessage(session, 2, good, kPrompt), &response));
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(States(stub(), session), AllAt(kPrompt + 1, 0));
}

// A client that cancels its stream after layer 1 of a step answered leaves every request at
// layer 2 (nothing half-applied); one that cancels with layer 2's message unanswered leaves them
// at layer 2 or, if the server ran it first, at layer 0 of the next step: either way GetSession
// says which, the step continues from there, and Release frees every layer's pages.
TEST_F(ModelDecodeStreamTest, CancelMidStreamLeavesRequestsWhereGetSessionSays) {
  std::mt19937_64 rng(12);
  const std::string session = PrefilledModel(DType::kF32, DType::kF32, rng);
  const auto rows = [&rng] {
    std::vector<Tensor> r;
    for (size_t i = 0; i < kRequests.size(); ++i) r.push_back(RandomHidden(1, kDModel, rng));
    return r;
  };
  {
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub().DecodeStream(&context);
    v1::DecodeResponse response;
    ASSERT_TRUE(Exchange(*stream, StepMessage(session, 0, rows(), kPrompt), &response));
    ASSERT_TRUE(Exchange(*stream, StepMessage(session, 1, rows(), kPrompt), &response));
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_EQ(States(stub(), session), AllAt(kPrompt + 1, 2));

  int64_t length = kPrompt + 1;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub().DecodeStream(&context);
    ASSERT_TRUE(stream->Write(StepMessage(session, 2, rows(), kPrompt)));
    context.TryCancel();
    stream->Finish();
  }
  // The message ran or it did not; nothing in between.
  const std::vector<std::pair<int64_t, int>> after = States(stub(), session);
  ASSERT_TRUE(after == AllAt(length, 2) || after == AllAt(length, 0)) << after[0].second;
  const int next = after[0].second;
  grpc::ClientContext context;
  SetDeadline(context);
  auto stream = stub().DecodeStream(&context);
  v1::DecodeResponse response;
  for (int k = next; k < kLayers; ++k) {
    const int64_t position = k == 0 ? length : length - 1;
    if (k == 0) ++length;
    ASSERT_TRUE(Exchange(*stream, StepMessage(session, k, rows(), position), &response))
        << "layer " << k << ": " << Describe(stream->Finish());
    EXPECT_EQ(response.results(0).sequence_length(), length);
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(States(stub(), session), AllAt(length, 0));
  for (const std::string& id : kRequests) ASSERT_TRUE(Release(stub(), session, id).ok());
  EXPECT_EQ(SessionInfoOf(stub(), session).kv_bytes_used(), 0);
}

}  // namespace
}  // namespace attnserve::server_test

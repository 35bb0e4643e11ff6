// Issue 14: inputs that used to crash, hang or corrupt the server, each reproduced against the
// real binary. What every case must show afterwards: the precise status, nothing applied that the
// client was told failed, and a server that still answers.
//
//   request bytes that do not parse (every RPC)        INVALID_ARGUMENT naming the message type
//   a DecodeStream message that does not parse         INVALID_ARGUMENT ends the stream
//   finite but huge hidden values (3e38)               INVALID_ARGUMENT; the cache stays clean
//   weights that overflow the layer's output           INVALID_ARGUMENT; nothing appended
//   a response that could pass --max_message_bytes    RESOURCE_EXHAUSTED before anything applies
//   a retry of an applied call under its call_id       the same answer, appended once
//   a layer larger than --max_parameter_bytes          RESOURCE_EXHAUSTED before any allocation
//   a Configure past its deadline                      DEADLINE_EXCEEDED; its budget returned
//   a 1 MiB session id                                 INVALID_ARGUMENT with a short message
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/sync_stream.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/model/layer_weights.h"
#include "server/session/parameter_budget.h"
#include "tests/reference/test_cases.h"
#include "tests/support/server_fixture.h"

namespace attnserve::server_test {
namespace {

using reference::FindSpec;
using server::ConfigurePeakParameterBytes;
using server::LayerParameterBytes;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kService[] = "/attnserve.v1.AttentionService/";
constexpr int64_t kMaxMessageBytes = 64 << 10;

LayerSpec TestSpec() {  // GQA, d_model 64: small and quick.
  LayerSpec spec = FindSpec("gqa2_half_window7").spec;
  spec.sliding_window = 0;
  return spec;
}

// A spec of about `bytes` of fp32 weights (MHA, d_model 1024, head_dim 64).
LayerSpec SpecOfAbout(int64_t bytes) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMHA;
  spec.d_model = 1024;
  spec.head_dim = 64;
  spec.num_heads = spec.num_kv_heads =
      static_cast<int>(std::max<int64_t>(1, bytes / (4 * 4 * 1024 * 64)));
  spec.causal = true;
  return spec;
}

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer Serialized(const google::protobuf::Message& message) {
  return Bytes(message.SerializeAsString());
}

// One unary call with raw request bytes, as a broken or hostile client sends them.
grpc::Status RawUnary(grpc::Channel* channel, const std::string& method,
                      const grpc::ByteBuffer& request) {
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::ByteBuffer response;
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel,
      grpc::internal::RpcMethod((kService + method).c_str(), grpc::internal::RpcMethod::NORMAL_RPC),
      &context, request, &response);
}

class RobustnessTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
            absl::StrCat("--max_parameter_bytes=", kParameterBudget)};
  }
  // Room for the test spec's layers, and for one layer of ~48 MiB (its peak is twice that).
  static constexpr int64_t kParameterBudget = 100 << 20;

  void SetUp() override {
    ServerTest::SetUp();
    if (HasFatalFailure()) return;
    v1::ConfigureResponse configured;
    const grpc::Status status = Configure(stub(), SeedConfigure(TestSpec(), 3), &configured);
    ASSERT_TRUE(status.ok()) << Describe(status);
    session_ = configured.session_id();
  }

  Tensor Hidden(int64_t rows) { return RandomHidden(rows, TestSpec().d_model, rng_); }

  v1::ForwardRequest ForwardRequest(const std::string& id, const Tensor& hidden,
                                    const std::string& call_id = "") {
    v1::ForwardRequest request;
    request.set_session_id(session_);
    request.set_call_id(call_id);
    *request.add_items() = MakeForwardItem(id, hidden);
    return request;
  }

  int64_t RequestLength(const std::string& id) {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::GetSessionRequest request;
    request.set_session_id(session_);
    v1::GetSessionResponse response;
    EXPECT_TRUE(stub().GetSession(&context, request, &response).ok());
    for (const v1::RequestInfo& r : response.session().requests()) {
      if (r.request_id() == id) return r.sequence_length();
    }
    return 0;
  }

  std::string session_;
  std::mt19937_64 rng_{5};
};

TEST_F(RobustnessTest, UnparseableRequestsAreInvalidArgumentOnEveryRpc) {
  // A truncated varint, a wrong wire type, and a string field holding invalid UTF-8.
  const std::vector<std::string> malformed = {std::string("\x0a\xff\xff\xff", 4),
                                              std::string("\x0f\x01", 2),
                                              std::string("\x0a\x02\xc3\x28", 4)};
  for (const char* method : {"Configure", "Forward", "Decode", "Release", "GetSession",
                             "ListSessions", "GetServerInfo"}) {
    // The last sample only breaks messages whose field 1 is a string or a message: the two
    // requests without fields keep it as an unknown field, as protobuf must.
    const bool has_field_1 =
        std::string(method) != "ListSessions" && std::string(method) != "GetServerInfo";
    for (const std::string& bytes : malformed) {
      if (!has_field_1 && bytes == malformed.back()) continue;
      const grpc::Status status = RawUnary(channel_.get(), method, Bytes(bytes));
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << method << ": " << Describe(status);
      EXPECT_THAT(status.error_message(), HasSubstr("request is not a valid attnserve.v1."))
          << method;
    }
  }
  // The same channel still serves well-formed calls.
  v1::ForwardResponse forwarded;
  EXPECT_TRUE(Forward(stub(), ForwardRequest("ok", Hidden(3)), &forwarded).ok());
}

TEST_F(RobustnessTest, DecodeStreamEndsWithInvalidArgumentAtAnUnparseableMessage) {
  v1::ForwardResponse forwarded;
  ASSERT_TRUE(Forward(stub(), ForwardRequest("r", Hidden(2)), &forwarded).ok());
  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel_.get(),
          grpc::internal::RpcMethod(absl::StrCat(kService, "DecodeStream").c_str(),
                                    grpc::internal::RpcMethod::BIDI_STREAMING),
          &context));
  v1::DecodeRequest step;
  step.set_session_id(session_);
  *step.add_items() = MakeDecodeItem("r", Hidden(1));
  ASSERT_TRUE(stream->Write(Serialized(step)));
  grpc::ByteBuffer answer;
  ASSERT_TRUE(stream->Read(&answer));
  stream->Write(Bytes(std::string("\x0a\xff\xff\xff", 4)));
  stream->Write(Serialized(step));  // Never read: the stream ended at the bad message.
  stream->WritesDone();
  EXPECT_FALSE(stream->Read(&answer)) << "an answer after the unparseable message";
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("attnserve.v1.DecodeRequest"));
  EXPECT_EQ(RequestLength("r"), 3) << "only the step before the bad message applied";
}

TEST_F(RobustnessTest, HugeFiniteInputsAreRefusedAndDoNotPoisonTheCache) {
  v1::ForwardResponse forwarded;
  ASSERT_TRUE(Forward(stub(), ForwardRequest("r", Hidden(4)), &forwarded).ok());
  Tensor huge = Hidden(1);
  huge.f32()[7] = 3e38f;
  v1::DecodeRequest decode;
  decode.set_session_id(session_);
  *decode.add_items() = MakeDecodeItem("r", huge);
  v1::DecodeResponse decoded;
  const grpc::Status status = Decode(stub(), decode, &decoded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("items[0].hidden: holds a value of magnitude"));
  // The request is as it was, and its next step is finite.
  EXPECT_EQ(RequestLength("r"), 4);
  decode.clear_items();
  *decode.add_items() = MakeDecodeItem("r", Hidden(1));
  ASSERT_TRUE(Decode(stub(), decode, &decoded).ok());
  absl::StatusOr<Tensor> out = TensorFromProto(decoded.results(0).output());
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(FirstNonFiniteElement(*out), -1);
}

TEST_F(RobustnessTest, AnOutputThatOverflowsIsRolledBack) {
  // Finite inline weights of 3e38 overflow float32 in the value projection.
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(TestSpec(), 1);
  ASSERT_TRUE(weights.ok());
  v1::ConfigureRequest configure;
  *configure.mutable_spec() = LayerSpecToProto(TestSpec());
  for (auto& [name, tensor] : *weights) {
    float* values = tensor.f32();
    for (int64_t i = 0; i < tensor.num_elements(); ++i)
      values[i] = name == "v_proj.weight" ? 3e38f : values[i];
    v1::NamedTensor* named = configure.mutable_weights()->mutable_inline_weights()->add_tensors();
    named->set_name(name);
    TensorToProto(tensor, named->mutable_tensor());
  }
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), configure, &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  session_ = configured.session_id();
  v1::ForwardResponse forwarded;
  status = Forward(stub(), ForwardRequest("r", Hidden(5)), &forwarded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("output is not finite"));
  EXPECT_EQ(RequestLength("r"), 0) << "a failed Forward left tokens behind";
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetSessionRequest get;
  get.set_session_id(session_);
  v1::GetSessionResponse info;
  ASSERT_TRUE(stub().GetSession(&context, get, &info).ok());
  EXPECT_EQ(info.session().kv_bytes_used(), 0) << "the rolled-back call still holds pages";
}

TEST_F(RobustnessTest, AResponseThatCouldNotBeSentIsRefusedBeforeItApplies) {
  // Many one-token items, as many as the request limit takes: each result carries a
  // sequence_length its item did not, so the answer is larger than the request and over the
  // limit. It must be refused before the tokens are appended, not after.
  v1::ForwardRequest request;
  request.set_session_id(session_);
  v1::ForwardResponse answer;  // What the server would have to send.
  for (int i = 0;; ++i) {
    const std::string id = absl::StrCat("i", i);
    const Tensor row = Hidden(1);
    *request.add_items() = MakeForwardItem(id, row);
    if (static_cast<int64_t>(request.ByteSizeLong()) > kMaxMessageBytes) {
      request.mutable_items()->RemoveLast();
      break;
    }
    v1::ForwardResult* result = answer.add_results();
    result->set_request_id(id);
    TensorToProto(row, result->mutable_output());
    result->set_sequence_length(1);
  }
  answer.mutable_results()->DeleteSubrange(request.items_size(),
                                           answer.results_size() - request.items_size());
  ASSERT_GT(static_cast<int64_t>(answer.ByteSizeLong()), kMaxMessageBytes)
      << "the scenario does not reproduce an answer over the limit";
  v1::ForwardResponse forwarded;
  grpc::Status status = Forward(stub(), request, &forwarded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("nothing was applied"));
  for (const v1::ForwardItem& item : request.items()) {
    ASSERT_EQ(RequestLength(item.request_id()), 0) << item.request_id();
  }
  // The same call in two halves fits, and runs.
  v1::ForwardRequest half = request;
  half.mutable_items()->DeleteSubrange(0, request.items_size() / 2);
  status = Forward(stub(), half, &forwarded);
  EXPECT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(RequestLength(half.items(0).request_id()), 1);
}

TEST_F(RobustnessTest, ARetryUnderTheSameCallIdIsAnsweredWithoutApplyingTwice) {
  const Tensor prompt = Hidden(6);
  v1::ForwardResponse first, again;
  ASSERT_TRUE(Forward(stub(), ForwardRequest("r", prompt, "call-1"), &first).ok());
  ASSERT_TRUE(Forward(stub(), ForwardRequest("r", prompt, "call-1"), &again).ok());
  EXPECT_EQ(again.results(0).sequence_length(), 6);
  EXPECT_EQ(again.results(0).output().data(), first.results(0).output().data());
  EXPECT_EQ(RequestLength("r"), 6);

  v1::DecodeRequest decode;
  decode.set_session_id(session_);
  decode.set_call_id("step-7");
  *decode.add_items() = MakeDecodeItem("r", Hidden(1));
  v1::DecodeResponse d1, d2;
  ASSERT_TRUE(Decode(stub(), decode, &d1).ok());
  ASSERT_TRUE(Decode(stub(), decode, &d2).ok());
  EXPECT_EQ(d2.results(0).sequence_length(), 7);
  EXPECT_EQ(d2.results(0).output().data(), d1.results(0).output().data());
  EXPECT_EQ(RequestLength("r"), 7);
  // A new call_id applies again; no call_id always applies.
  decode.set_call_id("step-8");
  ASSERT_TRUE(Decode(stub(), decode, &d2).ok());
  decode.clear_call_id();
  ASSERT_TRUE(Decode(stub(), decode, &d2).ok());
  EXPECT_EQ(RequestLength("r"), 9);

  // A call_id applied to one of the call's requests but not to the other is refused.
  v1::ForwardResponse other;
  ASSERT_TRUE(Forward(stub(), ForwardRequest("s", Hidden(2)), &other).ok());
  decode.set_call_id("step-10");
  ASSERT_TRUE(Decode(stub(), decode, &d2).ok());  // Applied to "r" alone.
  *decode.add_items() = MakeDecodeItem("s", Hidden(1));
  const grpc::Status status = Decode(stub(), decode, &d2);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_EQ(RequestLength("s"), 2);
}

// A call_id reused with other inputs is not a retry: it used to be answered with the earlier
// call's output and OK. It is INVALID_ARGUMENT naming call_id, and applies nothing; a faithful
// retry is still answered from the retained output.
TEST_F(RobustnessTest, ACallIdReusedWithOtherInputsIsRefused) {
  const Tensor prompt = Hidden(6);
  v1::ForwardResponse first, answered;
  ASSERT_TRUE(Forward(stub(), ForwardRequest("r", prompt, "call-1"), &first).ok());
  const auto expect_refused = [&](const grpc::Status& status, const std::string& what) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what << ": "
                                                                       << Describe(status);
    EXPECT_THAT(status.error_message(),
                HasSubstr("call_id: 'call-1' was already used by a call with other inputs"))
        << what;
  };
  expect_refused(Forward(stub(), ForwardRequest("r", Hidden(6), "call-1"), &answered),
                 "other rows");
  expect_refused(Forward(stub(), ForwardRequest("r", Hidden(3), "call-1"), &answered),
                 "other row count");
  v1::ForwardRequest positioned = ForwardRequest("r", prompt, "call-1");
  for (int64_t p = 0; p < 6; ++p) positioned.mutable_items(0)->add_positions(10 + p);
  expect_refused(Forward(stub(), positioned, &answered), "other positions");
  // The same rows as a Decode call (one row) under the Forward's call_id.
  const Tensor row = Hidden(1);
  ASSERT_TRUE(Forward(stub(), ForwardRequest("q", row, "call-1"), &answered).ok());
  v1::DecodeRequest as_decode;
  as_decode.set_session_id(session_);
  as_decode.set_call_id("call-1");
  *as_decode.add_items() = MakeDecodeItem("q", row);
  v1::DecodeResponse decoded;
  expect_refused(Decode(stub(), as_decode, &decoded), "a Decode of a Forward's rows");
  EXPECT_EQ(RequestLength("r"), 6) << "a refused call applied";
  EXPECT_EQ(RequestLength("q"), 1) << "a refused call applied";
  // The faithful retry is still a retry.
  ASSERT_TRUE(Forward(stub(), ForwardRequest("r", prompt, "call-1"), &answered).ok());
  EXPECT_EQ(answered.results(0).output().data(), first.results(0).output().data());
  EXPECT_EQ(RequestLength("r"), 6);

  // Decode: the same for a step.
  v1::DecodeRequest step;
  step.set_session_id(session_);
  step.set_call_id("step-1");
  *step.add_items() = MakeDecodeItem("r", Hidden(1));
  v1::DecodeResponse d1, d2;
  ASSERT_TRUE(Decode(stub(), step, &d1).ok());
  v1::DecodeRequest other_step = step;
  *other_step.mutable_items(0) = MakeDecodeItem("r", Hidden(1));
  const grpc::Status refused = Decode(stub(), other_step, &d2);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(refused);
  EXPECT_THAT(refused.error_message(), HasSubstr("call_id: 'step-1'"));
  ASSERT_TRUE(Decode(stub(), step, &d2).ok());
  EXPECT_EQ(d2.results(0).output().data(), d1.results(0).output().data());
  EXPECT_EQ(RequestLength("r"), 7);
}

TEST_F(RobustnessTest, AForwardPastItsDeadlineIsRetriedSafelyByCallId) {
  // A prompt long enough that a short deadline passes while it runs (or queues). The deadlines
  // double from 0.05 to 1.6 ms, so some expire before the call leaves, some while it computes,
  // whatever the speed of the engine and the load on the machine. (From 0.25 ms, a server on
  // OpenBLAS's SkylakeX kernels answered all 20 in time in about 1 run of 100.)
  const Tensor prompt = Hidden(200);
  int expired = 0;
  std::string outcomes;  // Each attempt's status code, for the message below.
  for (int attempt = 0; attempt < 20; ++attempt) {
    const std::string id = absl::StrCat("r", attempt);
    const std::string call_id = absl::StrCat("call-", attempt);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::microseconds(50 << (attempt % 6)));
    v1::ForwardResponse ignored;
    const grpc::Status status =
        stub().Forward(&context, ForwardRequest(id, prompt, call_id), &ignored);
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) ++expired;
    absl::StrAppend(&outcomes, " ", static_cast<int>(status.error_code()));
    // Whatever happened to it, the retry under the same call_id leaves exactly one copy.
    // The cancelled attempts' bytes can still hold gRPC's in-flight quota when the retry comes,
    // and the transport then resets the retry's stream (RST_STREAM 11) before the service reads
    // it: a refusal that changed nothing, which a client retries; the check below still holds.
    v1::ForwardResponse retried;
    grpc::Status retry;
    for (int transport_retries = 0; transport_retries < 10; ++transport_retries) {
      retry = Forward(stub(), ForwardRequest(id, prompt, call_id), &retried);
      if (!(retry.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
            absl::StrContains(retry.error_message(), "RST_STREAM"))) {
        break;
      }
    }
    ASSERT_TRUE(retry.ok()) << Describe(retry);
    EXPECT_EQ(retried.results(0).sequence_length(), 200) << id;
    EXPECT_EQ(RequestLength(id), 200) << id;
  }
  EXPECT_GT(expired, 0) << "no attempt met its deadline expiring; the test proved nothing "
                        << "(status codes:" << outcomes << ")";
}

TEST_F(RobustnessTest, AHugeLayerIsRefusedBeforeAnythingIsAllocated) {
  // The 25-byte Configure that aborted the server on std::bad_alloc: a 16 TiB projection.
  LayerSpec giant;
  giant.variant = AttentionVariant::kGQA;
  giant.d_model = 65536;
  giant.num_heads = 1024;
  giant.num_kv_heads = 1;
  giant.head_dim = 65536;
  giant.causal = true;
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), SeedConfigure(giant, 1), &configured);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("--max_parameter_bytes"));
  // Layers that fit are accepted until the budget is spent, and a release makes room again.
  const LayerSpec big = SpecOfAbout(kParameterBudget / 3);
  std::vector<std::string> sessions;
  for (int i = 0; i < 8; ++i) {
    status = Configure(stub(), SeedConfigure(big, i), &configured);
    if (!status.ok()) break;
    sessions.push_back(configured.session_id());
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
  ASSERT_FALSE(sessions.empty());
  absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->limits().max_parameter_bytes(), kParameterBudget);
  EXPECT_EQ(info->parameter_bytes_used() - LayerParameterBytes(TestSpec()),
            static_cast<int64_t>(sessions.size()) * LayerParameterBytes(big));
  ASSERT_TRUE(Release(stub(), sessions.back(), "").ok());
  status = Configure(stub(), SeedConfigure(big, 9), &configured);
  EXPECT_TRUE(status.ok()) << Describe(status);
}

TEST_F(RobustnessTest, AConfigurePastItsDeadlineIsAbandonedAndFreesItsBudget) {
  // A layer whose peak is most of the budget, so a leaked charge would refuse the next one.
  const LayerSpec big = SpecOfAbout(kParameterBudget * 2 / 5);
  ASSERT_LE(ConfigurePeakParameterBytes(big), kParameterBudget);
  ASSERT_GT(2 * ConfigurePeakParameterBytes(big), kParameterBudget);
  int expired = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(2));
    v1::ConfigureResponse ignored;
    const auto start = std::chrono::steady_clock::now();
    const grpc::Status status = stub().Configure(&context, SeedConfigure(big, attempt), &ignored);
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) ++expired;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    // The server gives the budget back once it notices; then a full-size layer fits again.
    grpc::Status next;
    v1::ConfigureResponse configured;
    for (int wait = 0; wait < 100; ++wait) {
      next = Configure(stub(), SeedConfigure(big, 100 + attempt), &configured);
      if (next.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(next.ok()) << "the abandoned Configure kept its budget: " << Describe(next);
    ASSERT_TRUE(Release(stub(), configured.session_id(), "").ok());
  }
  EXPECT_GT(expired, 0);
}

TEST_F(RobustnessTest, HugeIdsAreRefusedWithShortMessages) {
  const std::string huge(30000, 'x');  // Under --max_message_bytes, so it reaches the service.
  v1::ForwardRequest forward = ForwardRequest("r", Hidden(1));
  forward.set_session_id(huge);
  v1::ForwardResponse forwarded;
  grpc::Status status = Forward(stub(), forward, &forwarded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message().size();
  EXPECT_LT(status.error_message().size(), 300u);
  forward = ForwardRequest("r", Hidden(1), huge.substr(0, 4096));
  status = Forward(stub(), forward, &forwarded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("call_id: has 4096 bytes"));
  v1::GetSessionRequest get;
  get.set_session_id(huge);
  v1::GetSessionResponse info;
  grpc::ClientContext context;
  SetDeadline(context);
  status = stub().GetSession(&context, get, &info);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(status.error_message().size(), 300u);
}

// Release checked no request id: a 4,096-byte one came back whole in its NOT_FOUND. It is bounded
// as every other RPC bounds it (256 bytes), and an id echoed in a message is clipped.
TEST_F(RobustnessTest, ReleaseChecksAndClipsRequestIds) {
  v1::ReleaseResponse released;
  grpc::Status status = Release(stub(), session_, std::string(4096, 'x'), &released);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_EQ(status.error_message(), "request_id: has 4096 bytes, at most 256 allowed");
  // At the limit: looked up, not found, and echoed clipped.
  status = Release(stub(), session_, std::string(256, 'y'), &released);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("...(256 bytes)"));
  EXPECT_LT(status.error_message().size(), 300u);
  // The session is intact.
  v1::ForwardResponse forwarded;
  ASSERT_TRUE(Forward(stub(), ForwardRequest("r", Hidden(2)), &forwarded).ok());
  EXPECT_TRUE(Release(stub(), session_, "r", &released).ok());
}

}  // namespace
}  // namespace attnserve::server_test

// Fork (prefix sharing) against the real server: forks of a prefilled request decode bit for bit
// as independent requests prefilled with the same prompt, hold the prompt's full pages once (the
// session's KV grows by one copied partial page per fork), survive the release of their source,
// and every bad input gets its precise status.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using ::testing::HasSubstr;

LayerSpec GqaSpec() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 64;
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.rope = RopeLayout::kHalf;
  return spec;
}

grpc::Status Fork(v1::AttentionService::Stub& stub, const std::string& session,
                  const std::string& source, const std::vector<std::string>& new_ids,
                  v1::ForkResponse* response) {
  v1::ForkRequest request;
  request.set_session_id(session);
  request.set_request_id(source);
  for (const std::string& id : new_ids) request.add_new_request_ids(id);
  grpc::ClientContext context;
  SetDeadline(context);
  return stub.Fork(&context, request, response);
}

int64_t KvBytesUsed(v1::AttentionService::Stub& stub, const std::string& session) {
  v1::GetSessionRequest request;
  request.set_session_id(session);
  v1::GetSessionResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  EXPECT_TRUE(stub.GetSession(&context, request, &response).ok());
  return response.session().kv_bytes_used();
}

class ForkTest : public ServerTest {};

TEST_F(ForkTest, ForksDecodeBitForBitAsIndependentRequestsAndShareThePrompt) {
  const LayerSpec spec = GqaSpec();
  v1::ConfigureResponse configured;
  ASSERT_TRUE(Configure(stub(), SeedConfigure(spec, 7), &configured).ok());
  const std::string session = configured.session_id();
  const int64_t page_bytes = configured.cost().page_bytes();
  std::mt19937_64 rng(11);
  const int64_t prompt_length = 37;  // Two full pages of 16 tokens and a partial third.
  const Tensor prompt = RandomHidden(prompt_length, spec.d_model, rng);
  constexpr int kForks = 3;
  std::vector<std::string> forks, copies;
  for (int i = 0; i < kForks; ++i) {
    forks.push_back(absl::StrCat("fork", i));
    copies.push_back(absl::StrCat("copy", i));
  }
  // One Forward per request, all of the same shape: the projections of a row are bit-identical
  // only when the engine call that computes them has the same shape.
  std::vector<std::string> prefilled = copies;
  prefilled.insert(prefilled.begin(), "prompt");
  for (const std::string& id : prefilled) {
    v1::ForwardRequest forward;
    forward.set_session_id(session);
    *forward.add_items() = MakeForwardItem(id, prompt);
    v1::ForwardResponse forwarded;
    ASSERT_TRUE(Forward(stub(), forward, &forwarded).ok());
  }

  const int64_t before = KvBytesUsed(stub(), session);
  v1::ForkResponse forked;
  grpc::Status status = Fork(stub(), session, "prompt", forks, &forked);
  ASSERT_TRUE(status.ok()) << Describe(status);
  ASSERT_EQ(forked.results_size(), kForks);
  for (int i = 0; i < kForks; ++i) {
    EXPECT_EQ(forked.results(i).request_id(), forks[i]);
    EXPECT_EQ(forked.results(i).sequence_length(), prompt_length);
  }
  EXPECT_EQ(forked.kv_bytes_added(), kForks * page_bytes) << "only the partial page is copied";
  EXPECT_EQ(KvBytesUsed(stub(), session), before + kForks * page_bytes);
  // The source may go; its forks keep the pages they share with it.
  ASSERT_TRUE(Release(stub(), session, "prompt").ok());

  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    v1::DecodeRequest of_forks, of_copies;
    of_forks.set_session_id(session);
    of_copies.set_session_id(session);
    for (int i = 0; i < kForks; ++i) {
      const Tensor hidden = RandomHidden(1, spec.d_model, rng);
      *of_forks.add_items() = MakeDecodeItem(forks[i], hidden);
      *of_copies.add_items() = MakeDecodeItem(copies[i], hidden);
    }
    v1::DecodeResponse from_forks, from_copies;
    ASSERT_TRUE(Decode(stub(), of_forks, &from_forks).ok());
    ASSERT_TRUE(Decode(stub(), of_copies, &from_copies).ok());
    for (int i = 0; i < kForks; ++i) {
      EXPECT_EQ(from_forks.results(i).sequence_length(), prompt_length + step + 1);
      EXPECT_EQ(from_forks.results(i).output().data(), from_copies.results(i).output().data())
          << forks[i] << " decoded differently from " << copies[i];
    }
  }
}

TEST_F(ForkTest, BadInputsGetPreciseStatuses) {
  v1::ConfigureRequest configure = SeedConfigure(GqaSpec(), 1);
  configure.set_max_requests(3);
  v1::ConfigureResponse configured;
  ASSERT_TRUE(Configure(stub(), configure, &configured).ok());
  const std::string session = configured.session_id();
  std::mt19937_64 rng(1);
  v1::ForwardRequest forward;
  forward.set_session_id(session);
  *forward.add_items() = MakeForwardItem("a", RandomHidden(5, 64, rng));
  v1::ForwardResponse forwarded;
  ASSERT_TRUE(Forward(stub(), forward, &forwarded).ok());
  const auto expect = [&](const std::string& session_id, const std::string& source,
                          const std::vector<std::string>& ids, grpc::StatusCode code,
                          const std::string& needle) {
    v1::ForkResponse response;
    grpc::Status status = Fork(stub(), session_id, source, ids, &response);
    EXPECT_EQ(status.error_code(), code) << Describe(status);
    EXPECT_THAT(status.error_message(), HasSubstr(needle));
  };
  expect("0123", "a", {"b"}, grpc::StatusCode::NOT_FOUND, "session");
  expect(session, "missing", {"b"}, grpc::StatusCode::NOT_FOUND, "request 'missing' not found");
  expect(session, "a", {}, grpc::StatusCode::INVALID_ARGUMENT, "new_request_ids");
  expect(session, "a", {"b", "b"}, grpc::StatusCode::INVALID_ARGUMENT, "appears more than once");
  // A taken id is ALREADY_EXISTS naming it, as ImportRequest answers.
  expect(session, "a", {"a"}, grpc::StatusCode::ALREADY_EXISTS,
         "new_request_ids[0]: request 'a' already exists in session '" + session + "'");
  expect(session, "a", {"b", "a"}, grpc::StatusCode::ALREADY_EXISTS,
         "new_request_ids[1]: request 'a' already exists");
  expect(session, "a", {"b", ""}, grpc::StatusCode::INVALID_ARGUMENT, "new_request_ids[1]");
  expect(session, "a", {"b", "c", "d"}, grpc::StatusCode::RESOURCE_EXHAUSTED, "max_requests = 3");
  expect(session, "a", {std::string(300, 'x')}, grpc::StatusCode::INVALID_ARGUMENT,
         "new_request_ids[0]");
  // Nothing above changed the session: two forks still fit.
  v1::ForkResponse response;
  grpc::Status status = Fork(stub(), session, "a", {"b", "c"}, &response);
  EXPECT_TRUE(status.ok()) << Describe(status);
}

}  // namespace
}  // namespace attnserve::server_test

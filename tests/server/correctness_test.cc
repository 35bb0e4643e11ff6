// Test 1 of issue 3: for every variant, Forward then Decode through the service equals the
// in-process engine bit for bit, and DecodeStream equals unary Decode.
//
// The reference is the engine the server runs (CreateCpuBackend with the server's engine thread
// count, the same spec, RandomLayerWeights(spec, seed), the same cache settings and inputs), driven
// by calls that mirror the RPCs one to one. Outputs are compared as raw bytes: any difference in
// decoding the wire tensors, in weights, positions or batching shows.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/model/layer_weights.h"
#include "proto/codec/tensor_codec.h"
#include "tests/reference/test_cases.h"
#include "tests/support/server_fixture.h"

namespace attnserve::server_test {
namespace {

using reference::FindSpec;
using reference::NamedSpec;
using reference::SeedNote;
using reference::TestSeed;

struct VariantCase {
  std::string spec_name;  // In reference::SpecCatalog().
  DType input_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  std::string name() const {
    return spec_name + "_in" + std::string(DTypeName(input_dtype)) + "_kv" +
           std::string(DTypeName(kv_dtype));
  }
};

// gtest prints parameters in failure output and in ctest's test names.
void PrintTo(const VariantCase& param, std::ostream* out) { *out << param.name(); }

// Sends `items` to `session` as one Forward and runs them through `ref`: the service's response
// (checked ok, one result per item, in order and named as the items) and the reference's outputs.
void ForwardBoth(v1::AttentionService::Stub& stub, const std::string& session,
                 ReferenceSession& ref, const std::vector<ReferenceSession::ForwardInput>& items,
                 v1::ForwardResponse* response, std::vector<Tensor>* expected) {
  v1::ForwardRequest request;
  request.set_session_id(session);
  for (const auto& item : items) {
    *request.add_items() = MakeForwardItem(item.request_id, item.hidden, item.positions);
  }
  grpc::Status status = Forward(stub, request, response);
  ASSERT_TRUE(status.ok()) << Describe(status);
  absl::StatusOr<std::vector<Tensor>> outputs = ref.Forward(items);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  *expected = *std::move(outputs);
  ASSERT_EQ(response->results_size(), static_cast<int>(items.size()));
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(response->results(static_cast<int>(i)).request_id(), items[i].request_id);
  }
}

class ServiceMatchesEngineTest : public ServerTest,
                                 public ::testing::WithParamInterface<VariantCase> {};

TEST_P(ServiceMatchesEngineTest, ForwardDecodeAndStreamAreBitExact) {
  const VariantCase& param = GetParam();
  const NamedSpec named = FindSpec(param.spec_name);
  ASSERT_EQ(named.name, param.spec_name) << "no such spec in the catalogue";
  const LayerSpec& spec = named.spec;
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  std::mt19937_64 rng(seed);
  const int64_t d = spec.d_model;

  v1::ConfigureRequest configure = SeedConfigure(spec, seed);
  configure.set_kv_cache_dtype(DTypeToProto(param.kv_dtype));
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), configure, &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const std::string& session = configured.session_id();
  EXPECT_EQ(session.size(), 32u) << "128-bit id in hex: " << session;
  EXPECT_EQ(configured.cost().parameter_count(), ParameterCount(spec));
  EXPECT_EQ(configured.cost().kv_bytes_per_token(), KvBytesPerToken(spec, param.kv_dtype));

  absl::StatusOr<std::unique_ptr<ReferenceSession>> made =
      ReferenceSession::Create(spec, seed, param.kv_dtype);
  ASSERT_TRUE(made.ok()) << made.status();
  ReferenceSession& ref = **made;

  // Runs one Forward through the service and the reference; checks outputs and lengths.
  const auto forward = [&](const std::vector<ReferenceSession::ForwardInput>& items,
                           const std::vector<int64_t>& lengths_after) {
    v1::ForwardResponse response;
    std::vector<Tensor> expected;
    ASSERT_NO_FATAL_FAILURE(ForwardBoth(stub(), session, ref, items, &response, &expected));
    for (size_t i = 0; i < items.size(); ++i) {
      const v1::ForwardResult& result = response.results(static_cast<int>(i));
      EXPECT_EQ(result.sequence_length(), lengths_after[i]) << items[i].request_id;
      EXPECT_TRUE(SameBytes(result.output(), expected[i]))
          << "Forward output of " << items[i].request_id;
    }
    EXPECT_GE(response.timing().total_ns(), response.timing().compute_ns());
  };

  // 1. Prefill two requests of different lengths in one call (ragged batch; 37 crosses pages of
  //    16 and windows of 7 and 9), then extend "a" by a chunk whose explicit positions skip 3.
  const Tensor prompt_a = RandomHidden(37, d, rng, param.input_dtype);
  const Tensor prompt_d = RandomHidden(20, d, rng, param.input_dtype);
  forward({{"a", prompt_a, {}}, {"d", prompt_d, {}}}, {37, 20});
  forward({{"a", RandomHidden(5, d, rng, param.input_dtype), {40, 41, 42, 43, 44}}}, {42});
  // "b" and "c" get the same prompt in identical calls: b decodes through unary Decode, c through
  // DecodeStream, with the same step inputs.
  const Tensor prompt_bc = RandomHidden(19, d, rng, param.input_dtype);
  forward({{"b", prompt_bc, {}}}, {19});
  forward({{"c", prompt_bc, {}}}, {19});
  if (HasFatalFailure()) return;

  // 2. Unary decode steps: {a, d} together (a multi-item Decode), b alone.
  constexpr int kSteps = 6;
  std::vector<Tensor> step_inputs;
  std::vector<v1::Tensor> unary_b_outputs;
  for (int step = 0; step < kSteps; ++step) {
    // "a"'s positions ran ahead of its length (the chunk at 40..44), so its steps name theirs;
    // "d" in the same call takes the default (its length).
    std::vector<ReferenceSession::DecodeInput> ad = {
        {"a", RandomHidden(1, d, rng, param.input_dtype), 45 + step},
        {"d", RandomHidden(1, d, rng, param.input_dtype), std::nullopt}};
    step_inputs.push_back(RandomHidden(1, d, rng, param.input_dtype));
    std::vector<ReferenceSession::DecodeInput> b = {{"b", step_inputs.back(), std::nullopt}};
    for (const auto* items : {&ad, &b}) {
      v1::DecodeRequest request;
      request.set_session_id(session);
      for (const auto& item : *items) {
        *request.add_items() = MakeDecodeItem(item.request_id, item.hidden, item.position);
      }
      v1::DecodeResponse response;
      grpc::Status status = Decode(stub(), request, &response);
      ASSERT_TRUE(status.ok()) << "step " << step << ": " << Describe(status);
      absl::StatusOr<std::vector<Tensor>> expected = ref.Decode(*items);
      ASSERT_TRUE(expected.ok()) << expected.status();
      ASSERT_EQ(response.results_size(), static_cast<int>(items->size()));
      for (size_t i = 0; i < items->size(); ++i) {
        const v1::DecodeResult& result = response.results(static_cast<int>(i));
        const std::string& id = (*items)[i].request_id;
        EXPECT_EQ(result.request_id(), id);
        const int64_t prompt = id == "a" ? 42 : id == "d" ? 20 : 19;
        EXPECT_EQ(result.sequence_length(), prompt + step + 1) << id;
        EXPECT_TRUE(SameBytes(result.output(), (*expected)[i]))
            << "Decode step " << step << " of " << id;
        if (id == "b") unary_b_outputs.push_back(result.output());
      }
    }
  }
  ASSERT_EQ(unary_b_outputs.size(), static_cast<size_t>(kSteps));

  // 3. DecodeStream for "c" with b's step inputs: every answer equals b's unary answer and the
  //    reference. All steps are written before any is read, so the server sees a real stream.
  {
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub().DecodeStream(&context);
    for (int step = 0; step < kSteps; ++step) {
      v1::DecodeRequest request;
      request.set_session_id(session);
      *request.add_items() = MakeDecodeItem("c", step_inputs[step]);
      ASSERT_TRUE(stream->Write(request)) << "stream closed at step " << step;
    }
    ASSERT_TRUE(stream->WritesDone());
    for (int step = 0; step < kSteps; ++step) {
      v1::DecodeResponse response;
      ASSERT_TRUE(stream->Read(&response))
          << "no answer for step " << step << ": " << Describe(stream->Finish());
      ASSERT_EQ(response.results_size(), 1);
      EXPECT_EQ(response.results(0).request_id(), "c");
      EXPECT_EQ(response.results(0).sequence_length(), 19 + step + 1);
      absl::StatusOr<std::vector<Tensor>> expected =
          ref.Decode({{"c", step_inputs[step], std::nullopt}});
      ASSERT_TRUE(expected.ok()) << expected.status();
      EXPECT_TRUE(SameBytes(response.results(0).output(), (*expected)[0]))
          << "DecodeStream step " << step << " vs the engine";
      EXPECT_EQ(response.results(0).output().data(), unary_b_outputs[step].data())
          << "DecodeStream step " << step << " differs from unary Decode";
    }
    v1::DecodeResponse extra;
    EXPECT_FALSE(stream->Read(&extra)) << "more answers than steps";
    grpc::Status finished = stream->Finish();
    EXPECT_TRUE(finished.ok()) << Describe(finished);
  }

  // 4. Release frees the requests; a released request is unknown afterwards.
  for (const char* id : {"a", "b", "c", "d"}) {
    grpc::Status released = Release(stub(), session, id);
    EXPECT_TRUE(released.ok()) << id << ": " << Describe(released);
  }
  v1::DecodeRequest after;
  after.set_session_id(session);
  *after.add_items() = MakeDecodeItem("a", RandomHidden(1, d, rng, param.input_dtype));
  v1::DecodeResponse ignored;
  EXPECT_EQ(Decode(stub(), after, &ignored).error_code(), grpc::StatusCode::NOT_FOUND);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ServiceMatchesEngineTest,
    ::testing::Values(VariantCase{"mha_half_bias"}, VariantCase{"mha_half_noncausal"},
                      VariantCase{"mqa_half"}, VariantCase{"gqa2_half_bias_hd16_theta5e5"},
                      VariantCase{"gqa2_half_window7"}, VariantCase{"mla_q0_interleaved"},
                      VariantCase{"mla_q24_half"}, VariantCase{"mla_q0_interleaved_window9"},
                      // Wire and cache dtypes other than f32.
                      VariantCase{"gqa4_interleaved_obias", DType::kBF16, DType::kBF16},
                      VariantCase{"mla_q24_half", DType::kF16, DType::kBF16}),
    [](const ::testing::TestParamInfo<VariantCase>& info) { return info.param.name(); });

// A Forward run in chunks (--prefill_chunk_tokens=16: rows [0, 16), [16, 32), [32, 48), [48, 57)
// of a 37-row and a 20-row item, chunks crossing the items' edge) copies each chunk's rows out of
// the gathered input and its output into place; a Forward of one chunk runs from the input and
// takes the engine's output as it is. Both equal the engine's one-call Forward: bit for bit for the
// one chunk, within rounding for the chunks (their projections run on other row counts), so a row
// taken from the wrong place or put in the wrong place shows either way.
class ChunkedForwardTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--prefill_chunk_tokens=16"}; }
};

TEST_F(ChunkedForwardTest, ChunksAndOneChunkEqualTheEngine) {
  const NamedSpec named = FindSpec("gqa2_half_bias_hd16_theta5e5");
  ASSERT_EQ(named.name, "gqa2_half_bias_hd16_theta5e5");
  const LayerSpec& spec = named.spec;
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  std::mt19937_64 rng(seed);
  const int64_t d = spec.d_model;
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), SeedConfigure(spec, seed), &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  absl::StatusOr<std::unique_ptr<ReferenceSession>> made = ReferenceSession::Create(spec, seed);
  ASSERT_TRUE(made.ok()) << made.status();
  ReferenceSession& ref = **made;

  const auto forward = [&](const std::vector<ReferenceSession::ForwardInput>& items, bool exact) {
    v1::ForwardResponse response;
    std::vector<Tensor> expected;
    ASSERT_NO_FATAL_FAILURE(
        ForwardBoth(stub(), configured.session_id(), ref, items, &response, &expected));
    for (size_t i = 0; i < items.size(); ++i) {
      const v1::ForwardResult& result = response.results(static_cast<int>(i));
      if (exact) {
        EXPECT_TRUE(SameBytes(result.output(), expected[i])) << items[i].request_id;
        continue;
      }
      absl::StatusOr<Tensor> got = TensorFromProto(result.output(), 2, "output");
      ASSERT_TRUE(got.ok()) << got.status();
      const std::vector<float> actual = got->ToFloats();
      const std::vector<float> want = expected[i].ToFloats();
      ASSERT_EQ(actual.size(), want.size()) << items[i].request_id;
      for (size_t k = 0; k < want.size(); ++k) {
        ASSERT_LE(std::fabs(actual[k] - want[k]), 1e-5f + 1e-5f * std::fabs(want[k]))
            << items[i].request_id << " row " << k / d << " column " << k % d;
      }
    }
  };
  forward({{"a", RandomHidden(37, d, rng), {}}, {"b", RandomHidden(20, d, rng), {}}},
          /*exact=*/false);
  forward({{"c", RandomHidden(16, d, rng), {}}}, /*exact=*/true);
}

// Weights sent inline (the seed's tensors, as named f32 tensors) give the same outputs as the seed.
TEST_F(ServerTest, InlineWeightsEqualSeedWeights) {
  const LayerSpec spec = FindSpec("gqa2_half_bias_hd16_theta5e5").spec;
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, seed);
  ASSERT_TRUE(weights.ok()) << weights.status();

  v1::ConfigureRequest by_seed = SeedConfigure(spec, seed);
  v1::ConfigureRequest by_value = by_seed;
  for (const auto& [name, tensor] : *weights) {
    v1::NamedTensor* named = by_value.mutable_weights()->mutable_inline_weights()->add_tensors();
    named->set_name(name);
    TensorToProto(tensor, named->mutable_tensor());
  }
  std::mt19937_64 rng(seed);
  const Tensor prompt = RandomHidden(23, spec.d_model, rng);
  std::vector<std::string> outputs;
  for (const v1::ConfigureRequest* configure : {&by_seed, &by_value}) {
    v1::ConfigureResponse configured;
    grpc::Status status = Configure(stub(), *configure, &configured);
    ASSERT_TRUE(status.ok()) << Describe(status);
    v1::ForwardRequest request;
    request.set_session_id(configured.session_id());
    *request.add_items() = MakeForwardItem("r", prompt);
    v1::ForwardResponse response;
    status = Forward(stub(), request, &response);
    ASSERT_TRUE(status.ok()) << Describe(status);
    ASSERT_EQ(response.results_size(), 1);
    outputs.push_back(response.results(0).output().data());
  }
  EXPECT_EQ(outputs[0], outputs[1]) << "inline weights differ from the seed's";
}

}  // namespace
}  // namespace attnserve::server_test

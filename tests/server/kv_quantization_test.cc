// 8-bit KV caches through the service: Configure with kv_cache_quantization FP8_E4M3 or INT8
// reports the page bytes and KV bytes per token of the quantized pages (scales included),
// GetSession echoes the format, the session's KV use is whole quantized pages, and Forward then
// Decode equal the in-process engine with the same 8-bit storage bit for bit (so the server really
// stores codes: the f32-KV engine differs by ~1e-2). Quantization with a kv_cache_dtype, or an
// unknown value, is INVALID_ARGUMENT naming the fields.
#include "kernels/kv/quantization.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/model/layer_weights.h"
#include "tests/reference/test_cases.h"
#include "tests/support/server_fixture.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using ::testing::HasSubstr;

struct QuantCase {
  std::string spec_name;  // In reference::SpecCatalog().
  v1::KvCacheQuantization quantization;
  KvQuantization engine_quantization;
};

void PrintTo(const QuantCase& c, std::ostream* os) {
  *os << c.spec_name << " " << KvQuantizationName(c.engine_quantization);
}

class KvQuantizationServiceTest : public ServerTest,
                                  public ::testing::WithParamInterface<QuantCase> {};

TEST_P(KvQuantizationServiceTest, ReportsQuantizedPageBytesAndComputesAsTheEngine) {
  const QuantCase& c = GetParam();
  const LayerSpec spec = reference::FindSpec(c.spec_name).spec;
  ASSERT_GT(spec.d_model, 0);
  const KvStorageFormat storage = KvStorageFormat::Quantized(c.engine_quantization);
  const int page_size = DefaultPageSize(spec);
  const uint64_t seed = 5;

  v1::ConfigureRequest configure = SeedConfigure(spec, seed);
  configure.set_kv_cache_quantization(c.quantization);
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), configure, &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const int64_t page_bytes = KvPageBytes(spec, storage, page_size);
  EXPECT_EQ(configured.cost().page_bytes(), page_bytes);
  EXPECT_EQ(configured.cost().kv_bytes_per_token(), (page_bytes + page_size - 1) / page_size);
  EXPECT_LT(configured.cost().kv_bytes_per_token(), KvBytesPerToken(spec, DType::kBF16));

  // The in-process engine with the same storage, weights and thread count.
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, seed);
  ASSERT_TRUE(weights.ok());
  KvCacheConfig kv;
  kv.storage = storage;
  absl::StatusOr<reference::TestEngine> engine =
      reference::MakeEngine(spec, *weights, kv, {.num_threads = kBackendThreads});
  ASSERT_TRUE(engine.ok()) << engine.status();
  AttentionLayer& layer = *engine->layer;
  const SequenceId sequence = layer.CreateSequence();

  std::mt19937_64 rng(seed);
  const int64_t prompt = page_size + 5;  // A full page and a partial one.
  const Tensor hidden = RandomHidden(prompt, spec.d_model, rng);
  v1::ForwardRequest forward;
  forward.set_session_id(configured.session_id());
  *forward.add_items() = MakeForwardItem("r", hidden);
  v1::ForwardResponse forwarded;
  status = Forward(stub(), forward, &forwarded);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const PrefillChunk chunk{.sequence = sequence, .num_tokens = prompt};
  absl::StatusOr<Tensor> expected = layer.Prefill({&chunk, 1}, hidden, {});
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(SameBytes(forwarded.results(0).output(), *expected));

  for (int step = 0; step < 3; ++step) {
    const Tensor token = RandomHidden(1, spec.d_model, rng);
    v1::DecodeRequest decode;
    decode.set_session_id(configured.session_id());
    *decode.add_items() = MakeDecodeItem("r", token);
    v1::DecodeResponse decoded;
    status = Decode(stub(), decode, &decoded);
    ASSERT_TRUE(status.ok()) << Describe(status);
    absl::StatusOr<Tensor> expected_step = layer.Decode({&sequence, 1}, token, {});
    ASSERT_TRUE(expected_step.ok()) << expected_step.status();
    EXPECT_TRUE(SameBytes(decoded.results(0).output(), *expected_step)) << "step " << step;
  }

  v1::GetSessionRequest get;
  get.set_session_id(configured.session_id());
  v1::GetSessionResponse info;
  grpc::ClientContext context;
  SetDeadline(context);
  status = stub().GetSession(&context, get, &info);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(info.session().kv_cache_quantization(), c.quantization);
  EXPECT_EQ(info.session().kv_cache_dtype(), v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(info.session().cost().page_bytes(), page_bytes);
  EXPECT_EQ(info.session().kv_bytes_used(), 2 * page_bytes) << "prompt + 3 tokens: two pages";
  EXPECT_EQ(info.session().kv_bytes_used(), layer.SequenceKvBytes(sequence).value_or(-1));
}

INSTANTIATE_TEST_SUITE_P(
    Formats, KvQuantizationServiceTest,
    ::testing::Values(
        QuantCase{"gqa2_half_bias_hd16_theta5e5", v1::KV_CACHE_QUANTIZATION_FP8_E4M3,
                  KvQuantization::kFp8E4M3},
        QuantCase{"gqa2_half_bias_hd16_theta5e5", v1::KV_CACHE_QUANTIZATION_INT8,
                  KvQuantization::kInt8},
        QuantCase{"mla_q24_half", v1::KV_CACHE_QUANTIZATION_FP8_E4M3, KvQuantization::kFp8E4M3},
        QuantCase{"mla_q24_half", v1::KV_CACHE_QUANTIZATION_INT8, KvQuantization::kInt8}),
    [](const ::testing::TestParamInfo<QuantCase>& info) {
      return info.param.spec_name + "_" +
             std::string(KvQuantizationName(info.param.engine_quantization));
    });

class KvQuantizationRefusalTest : public ServerTest {};

TEST_F(KvQuantizationRefusalTest, WithADtypeOrUnknownIsInvalidArgumentNamingTheFields) {
  const LayerSpec spec = reference::FindSpec("mqa_half").spec;
  v1::ConfigureRequest configure = SeedConfigure(spec, 1);
  configure.set_kv_cache_quantization(v1::KV_CACHE_QUANTIZATION_INT8);
  configure.set_kv_cache_dtype(v1::DTYPE_BF16);
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), configure, &configured);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("kv_cache_quantization = int8"));
  EXPECT_THAT(status.error_message(), HasSubstr("kv_cache_dtype = bf16"));

  configure.clear_kv_cache_dtype();
  configure.set_kv_cache_quantization(static_cast<v1::KvCacheQuantization>(9));
  status = Configure(stub(), configure, &configured);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("kv_cache_quantization = 9"));
}

}  // namespace
}  // namespace attnserve::server_test

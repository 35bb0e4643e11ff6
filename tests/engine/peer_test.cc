// The peer test: our CPU engine against code nobody here wrote.
//
// tests/peer/make_peer_cases.py builds tiny random Llama, Qwen2, Mistral and DeepSeek-V3 models
// (also with Llama 3.1's llama3 and DeepSeek-V3's / Qwen2.5's YaRN rope scaling), and Qwen3,
// Gemma 2, Gemma 3, gpt-oss and Phi-3 ones (q/k norms, soft-capping, per-layer windows and RoPE
// bases, sinks, fused qkv_proj, partial rotary dims), and BLOOM and MPT ones (ALiBi, their own
// checkpoint names: query_key_value per head, Wqkv) at layer 0 and at a later layer
// with Hugging Face transformers (eager attention, float32) and a torch.nn.MultiheadAttention,
// saves their checkpoints, and records one layer's self_attn input and output. For every case
// directory this test loads the spec (spec.json, our JSON form) and the checkpoint through our own
// loader, runs the layer, and requires
//     ||ours - theirs|| / ||theirs|| <= 1e-4   (fp32 compute and fp32 KV cache)
// both for a one-shot prefill of the whole sequence and for a prefill of the first half followed by
// one decode step per remaining token (positions continuing from the recorded ones), through a
// small page size so that decode crosses page boundaries.
//
// Usage: peer_test [gtest flags] [CASES_ROOT | CASE_DIR...]
//   CASES_ROOT holds one directory per case; without arguments $ATTNSERVE_PEER_CASES, then the
//   build's peer_cases directory (written by the ctest fixture peer_cases_generate).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/model/checkpoint_loader.h"
#include "kernels/kv/quantization.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/core/tensor.h"
#include "tests/reference/peer_case.h"

#ifndef ATTNSERVE_PEER_CASES_DIR
#define ATTNSERVE_PEER_CASES_DIR ""
#endif

namespace attnserve {
namespace {

namespace fs = std::filesystem;

constexpr double kMaxRelativeError = 1e-4;
// With the KV cache in bf16 (compute stays fp32): every cached k and v is rounded to 8 significant
// bits, 2^-9 = 2e-3 relative each, and the output inherits errors of that order through the
// softmax weights and the value sum. Largest for Gemma 2 at head_dim 256 (soft-capped, peaked
// logits): 2.9e-3 to 9.0e-3 over 24 fresh seeds, and 1.09e-2 on one case a build generated (the
// cases take a fresh seed per build, so a 1e-2 bound failed now and then). Bound 1.5x that worst
// case, the CUDA layer's bf16 bound too; a wrong or stale cached row moves the output by far more.
constexpr double kMaxRelativeErrorBf16Kv = 1.6e-2;
// With 8-bit KV pages (kernels/kv/quantization.h; per-page, per-head power-of-two scales): each
// cached value moves by at most one step of its page's final scale, int8 <= 1.6e-2 of its group's
// absmax, fp8 <= 2^-4 relative (2^-3 after rescales). Measured on these cases (pages of 8): int8
// 7.4e-3 to 2.7e-2 and fp8 1.6e-2 to 7.9e-2, except Gemma 2 at head_dim 256 with soft-capped,
// peaked logits (as with bf16 KV, its largest): int8 5.3e-2, fp8 1.07e-1. Bounds 1.5x that worst
// case; a defect (wrong, stale or shared scale) moves the output by far more.
constexpr double kMaxRelativeErrorInt8Kv = 8e-2;
constexpr double kMaxRelativeErrorFp8Kv = 1.6e-1;
// Page size for the prefill-then-decode run: small, so decode crosses several page boundaries.
constexpr int kSmallPageSize = 8;

// Case arguments from the command line; set by main() before gtest registers the tests.
std::vector<std::string>* g_case_args = nullptr;

// Case directories: each argument that holds a spec.json is a case; any other argument (or the
// default root) is searched one level down. Sorted, so test names are stable.
std::vector<std::string> FindCaseDirs() {
  std::vector<std::string> roots;
  if (g_case_args != nullptr && !g_case_args->empty()) {
    roots = *g_case_args;
  } else {
    roots.push_back(
        reference::PeerCasesRoot("ATTNSERVE_PEER_CASES", ATTNSERVE_PEER_CASES_DIR).string());
  }
  std::vector<std::string> cases;
  for (const std::string& root : roots) {
    std::error_code ec;
    if (fs::exists(fs::path(root) / "spec.json", ec)) {
      cases.push_back(root);
      continue;
    }
    for (const fs::path& dir : reference::PeerCaseDirs(root, {"spec.json"})) {
      cases.push_back(dir.string());
    }
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

// Everything one case directory holds, loaded through our own readers.
struct PeerCase {
  std::string name;
  LayerSpec spec;
  LayerWeights weights;
  int layer_index = 0;
  int64_t prefill_split = 0;  // Tokens prefilled before decoding the rest.
  int64_t seq_len = 0;
  std::vector<int64_t> positions;  // [seq_len]
  Tensor hidden;                   // [seq_len, d_model] f32, self_attn input
  Tensor expected;                 // [seq_len, d_model] f32, one-shot prefill output
  Tensor expected_split;           // [seq_len, d_model] f32, prefill-then-decode output
};

absl::StatusOr<PeerCase> LoadCase(const fs::path& dir) {
  PeerCase c;
  c.name = dir.filename().string();

  absl::StatusOr<LayerSpec> spec = reference::ReadRecordedSpec(dir);
  if (!spec.ok()) return spec.status();
  c.spec = *spec;

  absl::StatusOr<reference::PeerCaseInfo> info = reference::ReadCaseInfo(dir);
  if (!info.ok()) return info.status();
  if (info->prefill_split < 0) {
    return absl::InvalidArgumentError(
        "case.json: expected an object with integer layer_index and prefill_split");
  }
  c.layer_index = info->layer_index;
  c.prefill_split = info->prefill_split;

  absl::StatusOr<reference::PeerIo> io = reference::ReadPeerIo(dir);
  if (!io.ok()) return io.status();
  if (!io->has_expected_split) return absl::NotFoundError("io.safetensors: no expected_split");
  c.hidden = std::move(io->hidden);
  c.expected = std::move(io->expected);
  c.expected_split = std::move(io->expected_split);
  c.positions = std::move(io->positions);

  c.seq_len = c.hidden.rank() == 2 ? c.hidden.dim(0) : -1;
  const std::vector<int64_t> rows = {c.seq_len, c.spec.d_model};
  for (auto [name, t] : {std::pair{"hidden", &c.hidden}, std::pair{"expected", &c.expected},
                         std::pair{"expected_split", &c.expected_split}}) {
    if (absl::Status s = CheckShape(*t, rows, name); !s.ok()) return s;
    if (t->dtype() != DType::kF32)
      return absl::InvalidArgumentError(absl::StrCat(name, ": not F32"));
  }
  if (static_cast<int64_t>(c.positions.size()) != c.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("positions: ", c.positions.size(), " of them for ", c.seq_len, " tokens"));
  }
  if (c.prefill_split < 1 || c.prefill_split >= c.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("case.json: prefill_split ", c.prefill_split, " not in [1, ", c.seq_len, ")"));
  }

  // The checkpoint directory as save_pretrained wrote it: our loader resolves model.safetensors.
  absl::StatusOr<LayerWeights> weights =
      LoadLayerWeightsFromSafetensors(dir.string(), c.spec, c.layer_index);
  if (!weights.ok()) return weights.status();
  c.weights = std::move(*weights);
  return c;
}

// Rows [begin, end) of a [rows, cols] f32 tensor.
Tensor Rows(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t cols = t.dim(1);
  return Tensor::FromFloats({end - begin, cols},
                            absl::MakeConstSpan(t.f32() + begin * cols, (end - begin) * cols));
}

// ||actual - expected|| / ||expected|| over all elements, in double; +inf on any non-finite value.
double RelativeError(const Tensor& actual, const Tensor& expected) {
  const std::vector<float> a = actual.ToFloats();
  const std::vector<float> e = expected.ToFloats();
  if (a.size() != e.size()) return INFINITY;
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff += (double{a[i]} - e[i]) * (double{a[i]} - e[i]);
    norm += double{e[i]} * e[i];
  }
  return std::sqrt(diff / norm);
}

// Worst single row, for the failure message: which token went wrong says a lot (window edge, page
// boundary, first decode step).
std::string WorstRow(const Tensor& actual, const Tensor& expected) {
  const int64_t cols = expected.dim(1);
  int64_t worst = 0;
  double worst_err = -1.0;
  for (int64_t r = 0; r < expected.dim(0); ++r) {
    double diff = 0.0, norm = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double a = actual.f32()[r * cols + c], e = expected.f32()[r * cols + c];
      diff += (a - e) * (a - e);
      norm += e * e;
    }
    const double err = std::sqrt(diff / norm);
    if (!(err <= worst_err)) {
      worst_err = err;
      worst = r;
      if (std::isnan(err)) break;
    }
  }
  return absl::StrFormat("worst row %d (rel err %.3e)", worst, worst_err);
}

class PeerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    absl::StatusOr<PeerCase> loaded = LoadCase(GetParam());
    ASSERT_TRUE(loaded.ok()) << GetParam() << ": " << loaded.status();
    case_ = std::move(*loaded);
    absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend();
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
  }

  std::unique_ptr<AttentionLayer> MakeLayer(int page_size,
                                            KvStorageFormat kv_format = DType::kF32) {
    KvCacheConfig kv;
    kv.storage = kv_format;
    kv.page_size = page_size;
    absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
        backend_->CreateLayer(case_.spec, case_.weights, kv);
    EXPECT_TRUE(layer.ok()) << layer.status() << "\nspec: " << LayerSpecSummary(case_.spec);
    return layer.ok() ? std::move(*layer) : nullptr;
  }

  void Report(const std::string& what, double err) {
    std::cout << absl::StrFormat("[peer] %-32s %-22s rel err %.3e  (%s)\n", case_.name, what, err,
                                 LayerSpecSummary(case_.spec));
    RecordProperty(what + "_rel_err", absl::StrFormat("%.3e", err));
  }

  void CheckPrefillThenDecode(AttentionLayer& layer, const std::string& label,
                              double bound = kMaxRelativeError);

  PeerCase case_;
  std::unique_ptr<AttentionBackend> backend_;
};

TEST_P(PeerTest, OneShotPrefillMatches) {
  std::unique_ptr<AttentionLayer> layer = MakeLayer(/*page_size=*/0);
  ASSERT_NE(layer, nullptr);
  const SequenceId seq = layer->CreateSequence();
  const PrefillChunk chunk{seq, case_.seq_len};
  absl::StatusOr<Tensor> out = layer->Prefill({&chunk, 1}, case_.hidden, case_.positions);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->dtype(), DType::kF32);
  ASSERT_TRUE(CheckShape(*out, case_.expected.shape(), "prefill output").ok());
  const double err = RelativeError(*out, case_.expected);
  Report("prefill", err);
  EXPECT_LE(err, kMaxRelativeError) << WorstRow(*out, case_.expected);
  EXPECT_EQ(layer->SequenceLength(seq).value_or(-1), case_.seq_len);
}

// Prefills the first `prefill_split` tokens, decodes the rest one at a time and compares all rows.
void PeerTest::CheckPrefillThenDecode(AttentionLayer& layer, const std::string& label,
                                      double bound) {
  const SequenceId seq = layer.CreateSequence();
  const int64_t split = case_.prefill_split;
  const int64_t d_model = case_.spec.d_model;
  std::vector<float> outputs;
  outputs.reserve(case_.seq_len * d_model);

  const PrefillChunk chunk{seq, split};
  absl::StatusOr<Tensor> prefill =
      layer.Prefill({&chunk, 1}, Rows(case_.hidden, 0, split),
                    absl::MakeConstSpan(case_.positions).subspan(0, split));
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  ASSERT_TRUE(CheckShape(*prefill, {split, d_model}, "prefill output").ok());
  const std::vector<float> first = prefill->ToFloats();
  outputs.insert(outputs.end(), first.begin(), first.end());

  for (int64_t t = split; t < case_.seq_len; ++t) {
    absl::StatusOr<Tensor> step =
        layer.Decode({&seq, 1}, Rows(case_.hidden, t, t + 1), {&case_.positions[t], 1});
    ASSERT_TRUE(step.ok()) << "decode token " << t << ": " << step.status();
    ASSERT_TRUE(CheckShape(*step, {1, d_model}, "decode output").ok());
    const std::vector<float> row = step->ToFloats();
    outputs.insert(outputs.end(), row.begin(), row.end());
  }
  const Tensor out = Tensor::FromFloats({case_.seq_len, d_model}, outputs);
  const double err = RelativeError(out, case_.expected_split);
  Report(absl::StrCat("prefill", split, "+decode", label), err);
  EXPECT_LE(err, bound) << label << " " << WorstRow(out, case_.expected_split);
  EXPECT_EQ(layer.SequenceLength(seq).value_or(-1), case_.seq_len);
}

TEST_P(PeerTest, PrefillThenDecodeMatches) {
  std::unique_ptr<AttentionLayer> layer = MakeLayer(kSmallPageSize);
  ASSERT_NE(layer, nullptr);
  if (case_.spec.variant != AttentionVariant::kMLA) {
    CheckPrefillThenDecode(*layer, "");
    return;
  }
  // MLA decode has two forms (attention over the cached latent, or over up-projected keys and
  // values): the default (absorbed) above, then the other.
  CheckPrefillThenDecode(*layer, " absorbed");
  CpuBackendOptions options;
  options.mla_absorbed_decode = false;
  absl::StatusOr<std::unique_ptr<AttentionBackend>> backend = CreateCpuBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  backend_ = std::move(*backend);
  std::unique_ptr<AttentionLayer> unabsorbed = MakeLayer(kSmallPageSize);
  ASSERT_NE(unabsorbed, nullptr);
  CheckPrefillThenDecode(*unabsorbed, " unabsorbed");
}

// The whole sequence prefilled in chunks of 7 tokens (a chunk's queries see the keys earlier chunks
// cached, the window and sinks included), through pages of 8 so chunks straddle pages.
// The same with a bf16 KV cache, as a memory-bound deployment would run it.
TEST_P(PeerTest, PrefillThenDecodeWithBf16KvCache) {
  std::unique_ptr<AttentionLayer> layer = MakeLayer(kSmallPageSize, DType::kBF16);
  ASSERT_NE(layer, nullptr);
  CheckPrefillThenDecode(*layer, " bf16 KV", kMaxRelativeErrorBf16Kv);
}

// And with fp8 e4m3 and int8 KV pages (docs/kv_quantization.md) against transformers' fp32 output.
TEST_P(PeerTest, PrefillThenDecodeWith8BitKvCache) {
  for (const auto& [quantization, bound] :
       {std::pair{KvQuantization::kFp8E4M3, kMaxRelativeErrorFp8Kv},
        std::pair{KvQuantization::kInt8, kMaxRelativeErrorInt8Kv}}) {
    std::unique_ptr<AttentionLayer> layer =
        MakeLayer(kSmallPageSize, KvStorageFormat::Quantized(quantization));
    ASSERT_NE(layer, nullptr);
    CheckPrefillThenDecode(*layer, absl::StrCat(" ", KvQuantizationName(quantization), " KV"),
                           bound);
  }
}

TEST_P(PeerTest, ChunkedPrefillMatches) {
  if (!case_.spec.causal) GTEST_SKIP() << "a chunk of a bidirectional layer cannot see later ones";
  std::unique_ptr<AttentionLayer> layer = MakeLayer(kSmallPageSize);
  ASSERT_NE(layer, nullptr);
  const SequenceId seq = layer->CreateSequence();
  constexpr int64_t kChunk = 7;
  std::vector<float> outputs;
  for (int64_t begin = 0; begin < case_.seq_len; begin += kChunk) {
    const int64_t end = std::min(begin + kChunk, case_.seq_len);
    const PrefillChunk chunk{seq, end - begin};
    absl::StatusOr<Tensor> out =
        layer->Prefill({&chunk, 1}, Rows(case_.hidden, begin, end),
                       absl::MakeConstSpan(case_.positions).subspan(begin, end - begin));
    ASSERT_TRUE(out.ok()) << "chunk at " << begin << ": " << out.status();
    const std::vector<float> rows = out->ToFloats();
    outputs.insert(outputs.end(), rows.begin(), rows.end());
  }
  const Tensor out = Tensor::FromFloats({case_.seq_len, case_.spec.d_model}, outputs);
  const double err = RelativeError(out, case_.expected);
  Report(absl::StrCat("chunked prefill x", kChunk), err);
  EXPECT_LE(err, kMaxRelativeError) << WorstRow(out, case_.expected);
}

// Two copies of the case in one Prefill call, as two sequences: each must match on its own, so no
// token may attend across the sequence boundary.
TEST_P(PeerTest, BatchedPrefillKeepsSequencesApart) {
  std::unique_ptr<AttentionLayer> layer = MakeLayer(kSmallPageSize);
  ASSERT_NE(layer, nullptr);
  const PrefillChunk chunks[2] = {{layer->CreateSequence(), case_.seq_len},
                                  {layer->CreateSequence(), case_.seq_len}};
  std::vector<float> hidden = case_.hidden.ToFloats();
  hidden.insert(hidden.end(), hidden.begin(), hidden.end());
  std::vector<int64_t> positions = case_.positions;
  positions.insert(positions.end(), case_.positions.begin(), case_.positions.end());
  absl::StatusOr<Tensor> out = layer->Prefill(
      chunks, Tensor::FromFloats({2 * case_.seq_len, case_.spec.d_model}, hidden), positions);
  ASSERT_TRUE(out.ok()) << out.status();
  for (int s = 0; s < 2; ++s) {
    const Tensor rows = Rows(*out, s * case_.seq_len, (s + 1) * case_.seq_len);
    const double err = RelativeError(rows, case_.expected);
    Report(absl::StrCat("batched prefill seq", s), err);
    EXPECT_LE(err, kMaxRelativeError) << "sequence " << s << ", " << WorstRow(rows, case_.expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PeerTest, ::testing::ValuesIn(FindCaseDirs()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = fs::path(info.param).filename().string();
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

// An empty case list must fail loudly: a peer test that compares nothing proves nothing.
TEST(PeerCasesTest, CasesExist) {
  const std::vector<std::string> cases = FindCaseDirs();
  EXPECT_FALSE(cases.empty())
      << "no peer cases found (looked in the arguments, $ATTNSERVE_PEER_CASES, then "
      << ATTNSERVE_PEER_CASES_DIR << "); generate them with\n  .venv/bin/python "
      << "tests/peer/make_peer_cases.py --out <dir>\n(ctest runs this as peer_cases_generate; "
      << "run deploy/setup.sh first to create .venv)";
  for (const std::string& c : cases) std::cout << "[peer] case " << c << "\n";
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  // Case arguments must be known before InitGoogleTest: it registers the parameterized tests, and
  // that evaluates FindCaseDirs(). Every gtest flag starts with '-', so the rest are cases.
  static std::vector<std::string> case_args;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '-') case_args.push_back(argv[i]);
  }
  attnserve::g_case_args = &case_args;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

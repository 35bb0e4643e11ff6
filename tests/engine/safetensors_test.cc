// The safetensors reader/writer and the Hugging Face layer loader: round trips, hand-built files,
// every class of corrupt input, and spec/checkpoint mismatches.
#include "kernels/model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/model/checkpoint_loader.h"
#include "kernels/base/clip_for_message.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/model/layer_weights.h"
#include "kernels/base/path_confinement.h"
#include "kernels/core/tensor.h"

namespace attnserve {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh directory per test, so tests never see each other's files.
std::string TestDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(::testing::TempDir()) / "safetensors_test" /
                       absl::StrCat(info->test_suite_name(), ".", info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string U64Le(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

// A file from a header text and a data region, with the header length computed.
std::string FileBytes(const std::string& header, const std::string& data) {
  return U64Le(header.size()) + header + data;
}

// A tensor of `dtype` whose bytes are random (NaN payloads included), to test bit exactness.
Tensor RandomBitsTensor(DType dtype, std::vector<int64_t> shape, uint32_t seed) {
  Tensor tensor(dtype, std::move(shape));
  std::mt19937 rng(seed);
  for (size_t i = 0; i < tensor.num_bytes(); ++i) tensor.data()[i] = std::byte(rng() & 0xff);
  return tensor;
}

bool SameTensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.num_bytes() == b.num_bytes() &&
         (a.num_bytes() == 0 || std::memcmp(a.data(), b.data(), a.num_bytes()) == 0);
}

// Expects `status` to have `code` and a message containing every one of `parts`.
#define EXPECT_STATUS(status_expr, want_code, ...)                           \
  do {                                                                       \
    const absl::Status _s = (status_expr);                                   \
    EXPECT_EQ(_s.code(), want_code) << _s;                                   \
    for (const std::string& _part : std::vector<std::string>{__VA_ARGS__}) { \
      EXPECT_THAT(std::string(_s.message()), HasSubstr(_part));              \
    }                                                                        \
  } while (0)

// ---- Writing and reading back ----------------------------------------------------------------

TEST(SafetensorsTest, RoundTripIsBitExactForEveryDType) {
  const std::string path = TestDir() + "/t.safetensors";
  std::map<std::string, Tensor> tensors;
  tensors.emplace("a.f32", RandomBitsTensor(DType::kF32, {3, 5}, 1));
  tensors.emplace("b.f16", RandomBitsTensor(DType::kF16, {7}, 2));
  tensors.emplace("c.bf16", RandomBitsTensor(DType::kBF16, {2, 3, 3}, 3));
  tensors.emplace("d.scalar", RandomBitsTensor(DType::kF32, {}, 4));
  tensors.emplace("e.empty", Tensor(DType::kBF16, {0, 4}));
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "x"}};
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata).ok());

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->names(),
            (std::vector<std::string>{"a.f32", "b.f16", "c.bf16", "d.scalar", "e.empty"}));
  EXPECT_EQ(file->metadata(), metadata);
  for (const auto& [name, expected] : tensors) {
    absl::StatusOr<Tensor> read = file->Read(name);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(SameTensor(*read, expected)) << name << " " << read->DebugString();
  }
  absl::StatusOr<SafetensorsTensorInfo> info = file->info("c.bf16");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->dtype_name, "BF16");
  EXPECT_EQ(info->dtype, DType::kBF16);
  EXPECT_EQ(info->shape, (std::vector<int64_t>{2, 3, 3}));
  EXPECT_EQ(info->data_end - info->data_begin, 36u);
  EXPECT_EQ(file->info("zzz").status().code(), absl::StatusCode::kNotFound);
  EXPECT_STATUS(file->Read("zzz").status(), absl::StatusCode::kNotFound, "'zzz'", path);
}

TEST(SafetensorsTest, HeaderIsPaddedWithSpacesToEightBytes) {
  const std::string path = TestDir() + "/t.safetensors";
  std::map<std::string, Tensor> tensors;
  tensors.emplace("w", Tensor::FromFloats({1}, {2.0f}));
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  const std::string bytes = ReadBytes(path);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | uint8_t(bytes[i]);
  EXPECT_EQ(header_size % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + header_size + 4);
  const std::string header = bytes.substr(8, header_size);
  EXPECT_EQ(header.front(), '{');
  EXPECT_THAT(header, HasSubstr("\"dtype\":\"F32\""));
  EXPECT_THAT(header, ::testing::Not(HasSubstr("__metadata__")));  // Omitted when empty.
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
  float value;
  std::memcpy(&value, bytes.data() + 8 + header_size, 4);
  EXPECT_EQ(value, 2.0f);
}

TEST(SafetensorsTest, ReadsHandBuiltFile) {
  const std::string path = TestDir() + "/hand.safetensors";
  // Written the way Python's safetensors does: metadata first, offsets relative to the data.
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("y":{"dtype":"BF16","shape":[1,1],"data_offsets":[8,10]},)"
                             R"("z":{"dtype":"F16","shape":[],"data_offsets":[10,12]}})";
  std::string data;
  const float xs[2] = {1.5f, -2.0f};
  data.append(reinterpret_cast<const char*>(xs), 8);
  data += std::string("\xc0\x3f", 2);  // bf16 1.5, little-endian.
  data += std::string("\x00\xbc", 2);  // f16 -1.0.
  WriteBytes(path, FileBytes(header, data));

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->Read("x")->ToFloats(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(file->Read("y")->ToFloats(), (std::vector<float>{1.5f}));
  EXPECT_EQ(file->Read("y")->shape(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(file->Read("z")->ToFloats(), (std::vector<float>{-1.0f}));
  EXPECT_EQ(file->Read("z")->rank(), 0);
}

TEST(SafetensorsTest, EmptyHeaderObjectIsAValidFile) {
  const std::string path = TestDir() + "/empty.safetensors";
  WriteBytes(path, FileBytes("{}      ", ""));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->names().empty());
}

TEST(SafetensorsTest, ZeroDimensionMakesHugeShapeEmpty) {
  const std::string path = TestDir() + "/t.safetensors";
  WriteBytes(path, FileBytes(R"({"e":{"dtype":"F32","shape":[1099511627776,0],)"
                             R"("data_offsets":[0,0]}})",
                             ""));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->Read("e")->num_elements(), 0);
}

TEST(SafetensorsTest, UnsupportedDTypesOpenButDoNotRead) {
  const std::string path = TestDir() + "/t.safetensors";
  WriteBytes(path, FileBytes(R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                             R"("w8":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[16,20]},)"
                             R"("q":{"dtype":"Q7","shape":[3],"data_offsets":[20,21]},)"
                             R"("ok":{"dtype":"F32","shape":[1],"data_offsets":[21,25]}})",
                             std::string(25, '\0')));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(file->info("ids")->dtype.has_value());
  EXPECT_STATUS(file->Read("ids").status(), absl::StatusCode::kUnimplemented, "'ids'", "I64", path);
  EXPECT_STATUS(file->Read("w8").status(), absl::StatusCode::kUnimplemented, "'w8'", "F8_E4M3");
  EXPECT_STATUS(file->Read("q").status(), absl::StatusCode::kInvalidArgument, "'q'",
                "unknown safetensors dtype 'Q7'");
  EXPECT_TRUE(file->Read("ok").ok());
  EXPECT_EQ(DTypeFromSafetensors("F64").status().code(), absl::StatusCode::kUnimplemented);
}

TEST(SafetensorsTest, KnownDTypeSizesAreChecked) {
  const std::string path = TestDir() + "/t.safetensors";
  WriteBytes(path, FileBytes(R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})",
                             std::string(8, '\0')));
  EXPECT_STATUS(SafetensorsFile::Open(path).status(), absl::StatusCode::kInvalidArgument, "'ids'",
                "8 bytes", "need 16 bytes");
}

// ---- Corrupt input ---------------------------------------------------------------------------

struct CorruptCase {
  std::string name;
  std::string bytes;
  absl::StatusCode code;
  std::string message_part;
};

std::vector<CorruptCase> CorruptCases() {
  const std::string ok_data(8, '\0');
  auto entry = [](const std::string& body) { return FileBytes("{\"t\":" + body + "}", ""); };
  return {
      {"empty file", "", absl::StatusCode::kDataLoss, "8-byte header length"},
      {"5-byte file", "abcde", absl::StatusCode::kDataLoss, "is 5 bytes long"},
      {"header length huge", U64Le(uint64_t{1} << 62) + "{}", absl::StatusCode::kInvalidArgument,
       "exceeds the limit"},
      {"header length all ones", U64Le(~uint64_t{0}), absl::StatusCode::kInvalidArgument,
       "exceeds the limit"},
      {"header past end of file", U64Le(100) + "{\"t\":", absl::StatusCode::kDataLoss,
       "runs past the end"},
      {"invalid JSON", FileBytes("{\"t\": {", ""), absl::StatusCode::kInvalidArgument,
       "not valid JSON"},
      {"trailing garbage", FileBytes("{} x", ""), absl::StatusCode::kInvalidArgument,
       "not valid JSON"},
      {"invalid UTF-8", FileBytes("{\"\xff\":1}", ""), absl::StatusCode::kInvalidArgument,
       "not valid JSON"},
      {"header is an array", FileBytes("[1,2]", ""), absl::StatusCode::kInvalidArgument,
       "not an object (it is array)"},
      {"entry not an object", entry("7"), absl::StatusCode::kInvalidArgument,
       "'t' is not a JSON object"},
      {"no dtype", entry(R"({"shape":[1],"data_offsets":[0,4]})"),
       absl::StatusCode::kInvalidArgument, "'t' has no \"dtype\""},
      {"no shape", entry(R"({"dtype":"F32","data_offsets":[0,4]})"),
       absl::StatusCode::kInvalidArgument, "has no \"shape\""},
      {"no data_offsets", entry(R"({"dtype":"F32","shape":[1]})"),
       absl::StatusCode::kInvalidArgument, "has no \"data_offsets\""},
      {"dtype not a string", entry(R"({"dtype":32,"shape":[1],"data_offsets":[0,4]})"),
       absl::StatusCode::kInvalidArgument, "\"dtype\" that is not a string"},
      {"shape not an array", entry(R"({"dtype":"F32","shape":"1","data_offsets":[0,4]})"),
       absl::StatusCode::kInvalidArgument, "\"shape\" that is not an array"},
      {"fractional dimension", entry(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"),
       absl::StatusCode::kInvalidArgument, "non-integer dimension 1.5"},
      {"string dimension", entry(R"({"dtype":"F32","shape":["1"],"data_offsets":[0,4]})"),
       absl::StatusCode::kInvalidArgument, "non-integer dimension"},
      {"negative dimension", entry(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"),
       absl::StatusCode::kInvalidArgument, "dimension -1"},
      {"dimension >= 2^63",
       entry(R"({"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]})"),
       absl::StatusCode::kInvalidArgument, "dimension 9223372036854775808"},
      {"one offset", entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})"),
       absl::StatusCode::kInvalidArgument, "not an array [begin, end]"},
      {"offsets an object", entry(R"({"dtype":"F32","shape":[1],"data_offsets":{"a":1}})"),
       absl::StatusCode::kInvalidArgument, "not an array [begin, end]"},
      {"negative offset", entry(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"),
       absl::StatusCode::kInvalidArgument, "not non-negative integers"},
      {"begin after end",
       FileBytes(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", ok_data),
       absl::StatusCode::kInvalidArgument, "[8, 4] with begin > end"},
      {"offsets past the data (truncated data)",
       FileBytes(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", ok_data),
       absl::StatusCode::kDataLoss, "past the end of the data region (8 bytes)"},
      {"offset near 2^64",
       FileBytes(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})",
                 ok_data),
       absl::StatusCode::kDataLoss, "past the end of the data region"},
      {"size mismatch",
       FileBytes(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", ok_data),
       absl::StatusCode::kInvalidArgument,
       "has 8 bytes of data but dtype F32 and shape [3] need 12"},
      {"shape product overflows",
       FileBytes(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],)"
                 R"("data_offsets":[0,8]}})",
                 ok_data),
       absl::StatusCode::kInvalidArgument, "need 2^64 bytes or more"},
      {"shape product wraps to the right size",  // 2^62 * 2^2 * 4 bytes wraps to 0 in 64 bits.
       FileBytes(R"({"t":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})",
                 ""),
       absl::StatusCode::kInvalidArgument, "need 2^64 bytes or more"},
      {"overlapping tensors",
       FileBytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 ok_data),
       absl::StatusCode::kInvalidArgument, "tensors 'a' (data_offsets [0, 8]) and 'b'"},
      {"metadata not an object", FileBytes(R"({"__metadata__":[1]})", ""),
       absl::StatusCode::kInvalidArgument, "\"__metadata__\" is not a JSON object"},
      {"metadata value not a string", FileBytes(R"({"__metadata__":{"n":1}})", ""),
       absl::StatusCode::kInvalidArgument, "value for 'n' is not a string"},
  };
}

TEST(SafetensorsTest, RejectsEveryClassOfCorruptInput) {
  const std::string dir = TestDir();
  int index = 0;
  for (const CorruptCase& c : CorruptCases()) {
    SCOPED_TRACE(c.name);
    const std::string path = absl::StrCat(dir, "/corrupt", index++, ".safetensors");
    WriteBytes(path, c.bytes);
    EXPECT_STATUS(SafetensorsFile::Open(path).status(), c.code, c.message_part, path);
  }
}

// Overlapping data_offsets alias one tensor's bytes as another's; they used to be accepted. Both
// tensors are named, whichever order the header lists them in; adjacent and empty tensors are fine.
TEST(SafetensorsTest, OverlappingTensorsAreRefusedNamingBoth) {
  const std::string dir = TestDir();
  const std::string data(24, '\0');
  struct Case {
    std::string header;
    std::string first, second;  // The two names the message must hold.
  };
  const std::vector<Case> overlapping = {
      // The same range twice.
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("y":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       "x", "y"},
      // One inside another, listed inner first.
      {R"({"inner":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
       R"("outer":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})",
       "outer", "inner"},
      // A later tensor overlapping one that is not its neighbour by begin.
      {R"({"a":{"dtype":"F32","shape":[5],"data_offsets":[0,20]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
       R"("c":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
       "a", "b"},
  };
  int index = 0;
  for (const Case& c : overlapping) {
    SCOPED_TRACE(c.header);
    const std::string path = absl::StrCat(dir, "/overlap", index++, ".safetensors");
    WriteBytes(path, FileBytes(c.header, data));
    const absl::Status status = SafetensorsFile::Open(path).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("tensors '" + c.first + "'"));
    EXPECT_THAT(status.message(), HasSubstr("and '" + c.second + "'"));
    EXPECT_THAT(status.message(), HasSubstr("overlap"));
  }
  // Adjacent ranges, and empty tensors anywhere, do not overlap.
  const std::string path = dir + "/adjacent.safetensors";
  WriteBytes(path, FileBytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]},)"
                             R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                             R"("f":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]}})",
                             data));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
}

TEST(SafetensorsTest, MissingFileAndDirectory) {
  const std::string dir = TestDir();
  EXPECT_STATUS(SafetensorsFile::Open(dir + "/nope.safetensors").status(),
                absl::StatusCode::kNotFound, "nope.safetensors", "No such file");
  EXPECT_STATUS(SafetensorsFile::Open(dir).status(), absl::StatusCode::kNotFound,
                "not a readable regular file (a directory)");
}

TEST(SafetensorsTest, FileTruncatedAfterOpenIsDataLoss) {
  const std::string path = TestDir() + "/t.safetensors";
  std::map<std::string, Tensor> tensors;
  tensors.emplace("w", Tensor(DType::kF32, {64}));
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  fs::resize_file(path, fs::file_size(path) - 10);
  EXPECT_STATUS(file->Read("w").status(), absl::StatusCode::kDataLoss, "'w'", "ends early");
}

TEST(SafetensorsTest, RandomCorruptionNeverCrashes) {
  // Run under ASan/UBSan this checks that no header or data corruption reads out of bounds,
  // overflows, or throws. The outcome itself may be any status.
  const std::string path = TestDir() + "/t.safetensors";
  std::map<std::string, Tensor> tensors;
  tensors.emplace("a", RandomBitsTensor(DType::kF32, {3, 4}, 5));
  tensors.emplace("b", RandomBitsTensor(DType::kBF16, {5}, 6));
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"k", "v"}}).ok());
  const std::string original = ReadBytes(path);
  std::mt19937 rng(42);
  const std::string fuzz_path = path + ".fuzz";
  for (int iteration = 0; iteration < 800; ++iteration) {
    std::string bytes = original;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;
        case 1:
          bytes.resize(at);
          break;
        default:  // Digits and JSON punctuation make numeric and structural damage likely.
          bytes[at] = "0123456789-.,[]{}\"e"[rng() % 19];
          break;
      }
      if (bytes.empty()) break;
    }
    WriteBytes(fuzz_path, bytes);
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(fuzz_path);
    if (!file.ok()) continue;
    for (const std::string& name : file->names()) (void)file->Read(name);
  }
}

TEST(SafetensorsTest, WriterRejectsReservedAndNonUtf8Names) {
  const std::string dir = TestDir();
  std::map<std::string, Tensor> reserved;
  reserved.emplace("__metadata__", Tensor(DType::kF32, {1}));
  EXPECT_STATUS(WriteSafetensors(dir + "/a.safetensors", reserved),
                absl::StatusCode::kInvalidArgument, "__metadata__");
  std::map<std::string, Tensor> bad_name;
  bad_name.emplace("w\xff", Tensor(DType::kF32, {1}));
  EXPECT_STATUS(WriteSafetensors(dir + "/b.safetensors", bad_name),
                absl::StatusCode::kInvalidArgument, "UTF-8");
  EXPECT_STATUS(WriteSafetensors(dir + "/no/such/dir/c.safetensors", {}),
                absl::StatusCode::kInternal, "no/such/dir/c.safetensors");
}

// ---- Loading a layer from a Hugging Face checkpoint -----------------------------------------

LayerSpec GqaSpec() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.qkv_bias = true;  // Qwen2-style.
  spec.rope = RopeLayout::kHalf;
  return spec;
}

LayerSpec MlaSpec(int q_lora_rank) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMLA;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.rope = RopeLayout::kInterleaved;
  spec.mla.q_lora_rank = q_lora_rank;
  spec.mla.kv_lora_rank = 32;
  spec.mla.qk_nope_head_dim = 16;
  spec.mla.qk_rope_head_dim = 8;
  spec.mla.v_head_dim = 16;
  return spec;
}

// Qwen3's q/k norms and gpt-oss's sinks on the GQA spec.
LayerSpec QkNormSinksSpec() {
  LayerSpec spec = GqaSpec();
  spec.qk_norm = QkNorm::kRms;
  spec.attention_sinks = true;
  return spec;
}

// Layer weights in a mix of dtypes (stored dtypes must come back unchanged).
LayerWeights MixedDTypeWeights(const LayerSpec& spec, uint64_t seed) {
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, seed);
  EXPECT_TRUE(weights.ok()) << weights.status();
  LayerWeights out;
  int i = 0;
  for (auto& [name, tensor] : *weights) {
    const DType dtype = i % 3 == 0 ? DType::kBF16 : i % 3 == 1 ? DType::kF16 : DType::kF32;
    out.emplace(name, tensor.CastTo(dtype));
    ++i;
  }
  return out;
}

// The layer's weights under HF names at `layer`, plus neighbours a real checkpoint has: another
// layer, an MLP weight and a rotary buffer, none of which may be picked up.
std::map<std::string, Tensor> CheckpointTensors(const LayerWeights& weights, int layer) {
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, tensor] : weights) {
    tensors.emplace(HfAttentionPrefix(layer) + name, tensor);
    tensors.emplace(HfAttentionPrefix(layer + 1) + name, Tensor(tensor.dtype(), tensor.shape()));
  }
  tensors.emplace(absl::StrCat("model.layers.", layer, ".mlp.up_proj.weight"),
                  Tensor(DType::kBF16, {8, 64}));
  tensors.emplace(HfAttentionPrefix(layer) + "rotary_emb.inv_freq", Tensor(DType::kF32, {8}));
  tensors.emplace("model.embed_tokens.weight", Tensor(DType::kBF16, {10, 64}));
  return tensors;
}

void ExpectSameWeights(const LayerWeights& actual, const LayerWeights& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_TRUE(actual.contains(name)) << name;
    EXPECT_TRUE(SameTensor(actual.at(name), tensor))
        << name << ": " << actual.at(name).DebugString() << " vs " << tensor.DebugString();
  }
}

class LoaderRoundTripTest : public ::testing::TestWithParam<std::pair<std::string, LayerSpec>> {};

TEST_P(LoaderRoundTripTest, SingleFileDirectoryAndShards) {
  const LayerSpec& spec = GetParam().second;
  const LayerWeights weights = MixedDTypeWeights(spec, 17);
  const std::map<std::string, Tensor> tensors = CheckpointTensors(weights, 3);
  const std::string dir = TestDir();

  // A single file, addressed directly.
  const std::string file = dir + "/layer.safetensors";
  ASSERT_TRUE(WriteSafetensors(file, tensors, {{"format", "pt"}}).ok());
  absl::StatusOr<LayerWeights> loaded = LoadLayerWeightsFromSafetensors(file, spec, 3);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameWeights(*loaded, weights);

  // A save_pretrained directory with model.safetensors.
  const std::string single_dir = dir + "/single";
  fs::create_directories(single_dir);
  ASSERT_TRUE(WriteSafetensors(single_dir + "/model.safetensors", tensors).ok());
  loaded = LoadLayerWeightsFromSafetensors(single_dir, spec, 3);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameWeights(*loaded, weights);

  // A sharded directory: tensors alternate between two shards, so layer 3 spans both.
  const std::string sharded_dir = dir + "/sharded";
  fs::create_directories(sharded_dir);
  std::map<std::string, Tensor> shards[2];
  std::string weight_map;
  int i = 0;
  for (const auto& [name, tensor] : tensors) {
    const int shard = i++ % 2;
    shards[shard].emplace(name, tensor);
    absl::StrAppend(&weight_map, weight_map.empty() ? "" : ",", "\"", name, "\":\"model-0000",
                    shard + 1, "-of-00002.safetensors\"");
  }
  ASSERT_TRUE(WriteSafetensors(sharded_dir + "/model-00001-of-00002.safetensors", shards[0]).ok());
  ASSERT_TRUE(WriteSafetensors(sharded_dir + "/model-00002-of-00002.safetensors", shards[1]).ok());
  WriteBytes(sharded_dir + "/model.safetensors.index.json",
             "{\"metadata\":{\"total_size\":0},\"weight_map\":{" + weight_map + "}}");
  loaded = LoadLayerWeightsFromSafetensors(sharded_dir, spec, 3);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameWeights(*loaded, weights);
}

INSTANTIATE_TEST_SUITE_P(Specs, LoaderRoundTripTest,
                         ::testing::Values(std::make_pair("gqa_qkv_bias", GqaSpec()),
                                           std::make_pair("gqa_qk_norm_sinks", QkNormSinksSpec()),
                                           std::make_pair("mla_q_lora", MlaSpec(24)),
                                           std::make_pair("mla_no_q_lora", MlaSpec(0))),
                         [](const auto& info) { return info.param.first; });

// Writes the GQA checkpoint for layer 3 with `edit` applied, returns its path.
std::string WriteEditedCheckpoint(const std::function<void(std::map<std::string, Tensor>&)>& edit,
                                  const LayerSpec& spec = GqaSpec()) {
  std::map<std::string, Tensor> tensors = CheckpointTensors(MixedDTypeWeights(spec, 5), 3);
  edit(tensors);
  const std::string path = TestDir() + "/model.safetensors";
  EXPECT_TRUE(WriteSafetensors(path, tensors).ok());
  return path;
}

TEST(LoaderTest, MissingTensorNamesTensorAndFile) {
  const std::string path =
      WriteEditedCheckpoint([](auto& t) { t.erase("model.layers.3.self_attn.k_proj.weight"); });
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, GqaSpec(), 3).status(),
                absl::StatusCode::kNotFound,
                "model.layers.3.self_attn.k_proj.weight is not in " + path,
                "requires it with shape [32, 64]", "it has: ");
}

TEST(LoaderTest, WrongShapeNamesBothShapes) {
  const std::string path = WriteEditedCheckpoint([](auto& t) {
    t["model.layers.3.self_attn.k_proj.weight"] = Tensor(DType::kBF16, {64, 64});
  });
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, GqaSpec(), 3).status(),
                absl::StatusCode::kInvalidArgument,
                "model.layers.3.self_attn.k_proj.weight in " + path + " has shape [64, 64]",
                "num_kv_heads=2, head_dim=16", "requires [32, 64]");
}

TEST(LoaderTest, CheckpointBiasWithoutSpecBias) {
  const std::string path = WriteEditedCheckpoint([](auto&) {});
  LayerSpec spec = GqaSpec();
  spec.qkv_bias = false;
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, spec, 3).status(),
                absl::StatusCode::kInvalidArgument, "model.layers.3.self_attn.",
                ".bias is in " + path, "does not use it", "qkv_bias=false");
}

TEST(LoaderTest, SpecBiasWithoutCheckpointBias) {
  LayerSpec no_bias = GqaSpec();
  no_bias.qkv_bias = false;
  const std::string path = WriteEditedCheckpoint([](auto&) {}, no_bias);
  LayerSpec spec = GqaSpec();
  spec.o_bias = true;
  spec.qkv_bias = false;
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, spec, 3).status(),
                absl::StatusCode::kNotFound, "model.layers.3.self_attn.o_proj.bias is not in",
                "(o_bias=true)");
}

TEST(LoaderTest, MlaQLoraMismatchListsWhatTheCheckpointHas) {
  const std::string path = WriteEditedCheckpoint([](auto&) {}, MlaSpec(24));
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, MlaSpec(0), 3).status(),
                absl::StatusCode::kNotFound, "model.layers.3.self_attn.q_proj.weight is not in",
                "mla.q_lora_rank=0", "q_a_proj.weight");
}

TEST(LoaderTest, UnknownExtraParameterIsRejectedButBuffersAreIgnored) {
  const std::string path = WriteEditedCheckpoint([](auto& t) {
    t.emplace("model.layers.3.self_attn.q_norm.weight", Tensor(DType::kBF16, {16}));  // Qwen3.
  });
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, GqaSpec(), 3).status(),
                absl::StatusCode::kInvalidArgument, "model.layers.3.self_attn.q_norm.weight is in",
                "does not use it");
}

TEST(LoaderTest, SinksWithoutSpecSinksAreRefusedNamingTheField) {
  // "sinks" has no .weight suffix; it must still count as a parameter, or a gpt-oss layer would
  // load without them and compute another softmax.
  const std::string path = WriteEditedCheckpoint(
      [](auto& t) { t.emplace("model.layers.3.self_attn.sinks", Tensor(DType::kBF16, {4})); });
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, GqaSpec(), 3).status(),
                absl::StatusCode::kInvalidArgument, "model.layers.3.self_attn.sinks is in",
                "attention_sinks=false");
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, QkNormSinksSpec(), 3).status(),
                absl::StatusCode::kNotFound, "model.layers.3.self_attn.q_norm.weight is not in",
                "(qk_norm=rms)");
}

// Phi-3's fused projection: q, k and v rows stacked in one qkv_proj (weight, and bias here).
std::map<std::string, Tensor> FuseQkv(std::map<std::string, Tensor> tensors, int layer) {
  const std::string prefix = HfAttentionPrefix(layer);
  for (const std::string suffix : {".weight", ".bias"}) {
    std::vector<float> rows;
    std::vector<int64_t> shape;
    for (const char* part : {"q_proj", "k_proj", "v_proj"}) {
      auto it = tensors.find(prefix + part + suffix);
      const std::vector<float> values = it->second.ToFloats();
      rows.insert(rows.end(), values.begin(), values.end());
      if (shape.empty()) shape = it->second.shape(), shape[0] = 0;
      shape[0] += it->second.dim(0);
      tensors.erase(it);
    }
    tensors.emplace(prefix + "qkv_proj" + suffix, Tensor::FromFloats(shape, rows));
  }
  return tensors;
}

TEST(LoaderTest, FusedQkvProjIsSplitIntoQKV) {
  const LayerSpec spec = GqaSpec();
  const LayerWeights weights = MixedDTypeWeights(spec, 23);
  const std::string path = TestDir() + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, FuseQkv(CheckpointTensors(weights, 3), 3)).ok());
  absl::StatusOr<LayerWeights> loaded = LoadLayerWeightsFromSafetensors(path, spec, 3);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  LayerWeights expected = weights;  // The fused tensor was written in f32.
  for (const char* name : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias",
                           "k_proj.bias", "v_proj.bias"}) {
    expected[name] = expected[name].CastTo(DType::kF32);
  }
  ExpectSameWeights(*loaded, expected);
}

TEST(LoaderTest, FusedQkvProjOfAnotherShapeOrBesideSeparateOnesIsRefused) {
  const LayerSpec spec = GqaSpec();
  std::map<std::string, Tensor> fused =
      FuseQkv(CheckpointTensors(MixedDTypeWeights(spec, 3), 3), 3);
  // Phi-3 with num_kv_heads 4 where the spec says 2: (4 + 2 * 4) * 16 rows, not (4 + 2 * 2) * 16.
  fused["model.layers.3.self_attn.qkv_proj.weight"] = Tensor(DType::kBF16, {192, 64});
  const std::string path = TestDir() + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, fused).ok());
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, spec, 3).status(),
                absl::StatusCode::kInvalidArgument,
                "model.layers.3.self_attn.qkv_proj.weight in " + path + " has shape [192, 64]",
                "requires [128, 64]");

  fused["model.layers.3.self_attn.qkv_proj.weight"] = Tensor(DType::kBF16, {128, 64});
  fused.emplace("model.layers.3.self_attn.k_proj.weight", Tensor(DType::kBF16, {32, 64}));
  ASSERT_TRUE(WriteSafetensors(path, fused).ok());
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, spec, 3).status(),
                absl::StatusCode::kInvalidArgument, "has both model.layers.3.self_attn.qkv_proj",
                "and model.layers.3.self_attn.k_proj.weight");
}

// ---- BLOOM's and MPT's names ---------------------------------------------------------------

// A tiny ALiBi layer: 2 heads of head_dim 2 over d_model 4, so that each of the 12 fused rows can
// be told apart by hand. BLOOM has biases on both projections, MPT (transformers) none.
LayerSpec AlibiSpec(Alibi alibi) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMHA;
  spec.d_model = 4;
  spec.num_heads = spec.num_kv_heads = 2;
  spec.head_dim = 2;
  spec.rope = RopeLayout::kNone;
  spec.alibi = alibi;
  spec.qkv_bias = spec.o_bias = alibi == Alibi::kBloom;
  return spec;
}

// [rows, cols] f32 whose element (r, c) is base + 10 * r + c: a row's values name the row.
Tensor RowNumbered(int64_t rows, int64_t cols, float base) {
  std::vector<float> values;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) values.push_back(base + 10.0f * r + c);
  }
  return Tensor::FromFloats(
      cols == 1 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, cols}, values);
}

// The rows `rows` of RowNumbered(*, cols, base), in that order.
std::vector<float> PickedRows(const std::vector<int64_t>& rows, int64_t cols, float base) {
  std::vector<float> values;
  for (int64_t r : rows) {
    for (int64_t c = 0; c < cols; ++c) values.push_back(base + 10.0f * r + c);
  }
  return values;
}

// What BloomForCausalLM.save_pretrained writes for layer `layer` (prefix `prefix`, e.g.
// "transformer.h.1.self_attention."), plus the neighbours a real checkpoint has: the MLP, the
// norms, another layer's attention and the embeddings, none of which may be picked up.
std::map<std::string, Tensor> BloomTensors(const std::string& prefix, const std::string& block,
                                           const std::string& next_block) {
  std::map<std::string, Tensor> tensors;
  tensors.emplace(prefix + "query_key_value.weight", RowNumbered(12, 4, 0.0f));
  tensors.emplace(prefix + "query_key_value.bias", RowNumbered(12, 1, 1000.0f));
  tensors.emplace(prefix + "dense.weight", RowNumbered(4, 4, 2000.0f));
  tensors.emplace(prefix + "dense.bias", RowNumbered(4, 1, 3000.0f));
  tensors.emplace(block + "mlp.dense_h_to_4h.weight", Tensor(DType::kF32, {16, 4}));
  tensors.emplace(block + "input_layernorm.weight", Tensor(DType::kF32, {4}));
  tensors.emplace(next_block + "self_attention.query_key_value.weight",
                  Tensor(DType::kF32, {9, 4}));
  tensors.emplace("word_embeddings.weight", Tensor(DType::kF32, {10, 4}));
  return tensors;
}

TEST(AlibiCheckpointTest, BloomQueryKeyValueIsSplitPerHead) {
  // query_key_value rows are view(heads=2, 3, head_dim=2): head 0's q rows 0-1, k 2-3, v 4-5, then
  // head 1's q rows 6-7, k 8-9, v 10-11 (BloomAttention._reshape).
  const LayerSpec spec = AlibiSpec(Alibi::kBloom);
  // As BloomForCausalLM saves it, and as bigscience's checkpoints (saved from BloomModel) name it.
  for (const std::string root : {"transformer.", ""}) {
    SCOPED_TRACE(root);
    const std::string path = TestDir() + "/model.safetensors";
    ASSERT_TRUE(WriteSafetensors(
                    path, BloomTensors(root + "h.1.self_attention.", root + "h.1.", root + "h.2."))
                    .ok());
    absl::StatusOr<LayerWeights> loaded = LoadLayerWeightsFromSafetensors(path, spec, 1);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ(loaded->size(), 8u);
    EXPECT_EQ(loaded->at("q_proj.weight").ToFloats(), PickedRows({0, 1, 6, 7}, 4, 0.0f));
    EXPECT_EQ(loaded->at("k_proj.weight").ToFloats(), PickedRows({2, 3, 8, 9}, 4, 0.0f));
    EXPECT_EQ(loaded->at("v_proj.weight").ToFloats(), PickedRows({4, 5, 10, 11}, 4, 0.0f));
    EXPECT_EQ(loaded->at("q_proj.bias").ToFloats(), PickedRows({0, 1, 6, 7}, 1, 1000.0f));
    EXPECT_EQ(loaded->at("k_proj.bias").ToFloats(), PickedRows({2, 3, 8, 9}, 1, 1000.0f));
    EXPECT_EQ(loaded->at("v_proj.bias").ToFloats(), PickedRows({4, 5, 10, 11}, 1, 1000.0f));
    EXPECT_EQ(loaded->at("o_proj.weight").ToFloats(), PickedRows({0, 1, 2, 3}, 4, 2000.0f));
    EXPECT_EQ(loaded->at("o_proj.bias").ToFloats(), PickedRows({0, 1, 2, 3}, 1, 3000.0f));
    EXPECT_EQ(loaded->at("q_proj.weight").shape(), (std::vector<int64_t>{4, 4}));
  }
}

TEST(AlibiCheckpointTest, MptWqkvIsSplitInThirds) {
  // MptAttention: Wqkv's rows chunk(3) into q (0-3), k (4-7), v (8-11); out_proj is o_proj.
  const LayerSpec spec = AlibiSpec(Alibi::kMpt);
  for (const std::string root : {"transformer.", ""}) {
    SCOPED_TRACE(root);
    const std::string prefix = root + "blocks.0.attn.";
    std::map<std::string, Tensor> tensors;
    tensors.emplace(prefix + "Wqkv.weight", RowNumbered(12, 4, 0.0f).CastTo(DType::kBF16));
    tensors.emplace(prefix + "out_proj.weight", RowNumbered(4, 4, 200.0f));
    tensors.emplace(root + "blocks.0.ffn.up_proj.weight", Tensor(DType::kF32, {8, 4}));
    tensors.emplace(root + "blocks.0.norm_1.weight", Tensor(DType::kF32, {4}));
    tensors.emplace(root + "blocks.1.attn.Wqkv.weight", Tensor(DType::kF32, {12, 4}));
    const std::string path = TestDir() + "/model.safetensors";
    ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
    absl::StatusOr<LayerWeights> loaded = LoadLayerWeightsFromSafetensors(path, spec, 0);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ(loaded->size(), 4u);
    EXPECT_EQ(loaded->at("q_proj.weight").dtype(), DType::kBF16);  // The stored dtype is kept.
    // Row values up to 114 are exact in bf16 (8 significant bits cover integers to 256).
    EXPECT_EQ(loaded->at("q_proj.weight").ToFloats(), PickedRows({0, 1, 2, 3}, 4, 0.0f));
    EXPECT_EQ(loaded->at("k_proj.weight").ToFloats(), PickedRows({4, 5, 6, 7}, 4, 0.0f));
    EXPECT_EQ(loaded->at("v_proj.weight").ToFloats(), PickedRows({8, 9, 10, 11}, 4, 0.0f));
    EXPECT_EQ(loaded->at("o_proj.weight").ToFloats(), PickedRows({0, 1, 2, 3}, 4, 200.0f));
  }
}

TEST(AlibiCheckpointTest, LlamaNamesStillLoadForAnAlibiSpec) {
  // attnctl convert writes any layer under model.layers.N.self_attn.q/k/v/o_proj names.
  const LayerSpec spec = AlibiSpec(Alibi::kBloom);
  const LayerWeights weights = MixedDTypeWeights(spec, 5);
  const std::string path = TestDir() + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, CheckpointTensors(weights, 2)).ok());
  absl::StatusOr<LayerWeights> loaded = LoadLayerWeightsFromSafetensors(path, spec, 2);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameWeights(*loaded, weights);
}

TEST(AlibiCheckpointTest, MissingOrMisShapedTensorsAreNamed) {
  const LayerSpec spec = AlibiSpec(Alibi::kBloom);
  const std::string path = TestDir() + "/model.safetensors";
  const std::string prefix = "transformer.h.1.self_attention.";
  auto write_edited = [&](const std::function<void(std::map<std::string, Tensor>&)>& edit) {
    std::map<std::string, Tensor> tensors = BloomTensors(prefix, "transformer.h.1.", "x.");
    edit(tensors);
    ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  };

  write_edited([&](auto& t) { t.erase(prefix + "query_key_value.weight"); });
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, spec, 1).status(),
                absl::StatusCode::kNotFound, prefix + "query_key_value.weight is not in " + path,
                "requires it with shape [12, 4]", "under " + prefix + " it has: dense.bias");

  write_edited([&](auto& t) { t.erase(prefix + "dense.bias"); });
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, spec, 1).status(),
                absl::StatusCode::kNotFound, prefix + "dense.bias is not in", "(o_bias=true)");

  // Three heads' worth of rows where the spec has two.
  write_edited([&](auto& t) { t[prefix + "query_key_value.weight"] = RowNumbered(18, 4, 0.0f); });
  EXPECT_STATUS(
      LoadLayerWeightsFromSafetensors(path, spec, 1).status(), absl::StatusCode::kInvalidArgument,
      prefix + "query_key_value.weight in " + path + " has shape [18, 4]", "requires [12, 4]");

  write_edited([&](auto& t) { t[prefix + "dense.weight"] = RowNumbered(4, 6, 0.0f); });
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, spec, 1).status(),
                absl::StatusCode::kInvalidArgument,
                prefix + "dense.weight in " + path + " has shape [4, 6]", "requires [4, 4]");

  // BLOOM's per-head interleave has no meaning with fewer K/V heads than query heads.
  write_edited([](auto&) {});
  LayerSpec grouped = spec;
  grouped.variant = AttentionVariant::kGQA;
  grouped.num_kv_heads = 1;
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, grouped, 1).status(),
                absl::StatusCode::kInvalidArgument, prefix + "query_key_value.weight: BLOOM's",
                "interleaves q, k and v per head", "num_kv_heads == num_heads");

  // A spec without ALiBi reads Llama's names only, and says which names it read.
  LayerSpec no_alibi = spec;
  no_alibi.alibi = Alibi::kNone;
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, no_alibi, 1).status(),
                absl::StatusCode::kNotFound,
                "has no tensors under model.layers.1.self_attn. at all",
                "BLOOM's and MPT's names are read for a spec with alibi bloom or mpt");

  // A BLOOM spec on an MPT checkpoint: every name BLOOM's may have is listed.
  std::map<std::string, Tensor> mpt;
  mpt.emplace("transformer.blocks.1.attn.Wqkv.weight", Tensor(DType::kF32, {12, 4}));
  ASSERT_TRUE(WriteSafetensors(path, mpt).ok());
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, spec, 1).status(),
                absl::StatusCode::kNotFound,
                "has no tensors under transformer.h.1.self_attention. at all (nor under "
                "h.1.self_attention., model.layers.1.self_attn.)");
}

TEST(AlibiCheckpointTest, MptQkLayerNormIsRefusedByName) {
  // MosaicML's attn_config.qk_ln adds LayerNorms of q and k (attn.q_ln, attn.k_ln), which
  // transformers' MptAttention never applies.
  const std::string prefix = "transformer.blocks.0.attn.";
  std::map<std::string, Tensor> tensors;
  tensors.emplace(prefix + "Wqkv.weight", RowNumbered(12, 4, 0.0f));
  tensors.emplace(prefix + "out_proj.weight", RowNumbered(4, 4, 0.0f));
  tensors.emplace(prefix + "q_ln.weight", Tensor(DType::kF32, {4}));
  tensors.emplace(prefix + "k_ln.weight", Tensor(DType::kF32, {4}));
  const std::string path = TestDir() + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, AlibiSpec(Alibi::kMpt), 0).status(),
                absl::StatusCode::kInvalidArgument, prefix + "k_ln.weight is in " + path,
                "MPT's attn_config.qk_ln (LayerNorm of q and k) is not supported");

  // MosaicML's no_bias=false: Wqkv.bias and out_proj.bias, loaded when the spec has biases.
  tensors.erase(prefix + "q_ln.weight");
  tensors.erase(prefix + "k_ln.weight");
  tensors.emplace(prefix + "Wqkv.bias", RowNumbered(12, 1, 500.0f));
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, AlibiSpec(Alibi::kMpt), 0).status(),
                absl::StatusCode::kInvalidArgument, prefix + "Wqkv.bias is in " + path,
                "(the spec has qkv_bias=false; set it for this checkpoint)");
  LayerSpec biased = AlibiSpec(Alibi::kMpt);
  biased.qkv_bias = true;
  absl::StatusOr<LayerWeights> loaded = LoadLayerWeightsFromSafetensors(path, biased, 0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->at("k_proj.bias").ToFloats(), PickedRows({4, 5, 6, 7}, 1, 500.0f));
}

TEST(LoaderTest, LayerPastTheEnd) {
  const std::string path = WriteEditedCheckpoint([](auto&) {});
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, GqaSpec(), 40).status(),
                absl::StatusCode::kNotFound, "has no tensors under model.layers.40.self_attn.");
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, GqaSpec(), -1).status(),
                absl::StatusCode::kInvalidArgument, "layer_index");
}

TEST(LoaderTest, MissingPathsAndShards) {
  const std::string dir = TestDir();
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(dir + "/absent", GqaSpec(), 0).status(),
                absl::StatusCode::kNotFound, "absent does not exist");
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(dir, GqaSpec(), 0).status(),
                absl::StatusCode::kNotFound,
                "has neither model.safetensors nor model.safetensors.index.json");

  const LayerWeights weights = MixedDTypeWeights(GqaSpec(), 1);
  std::string weight_map;
  for (const auto& [name, tensor] : weights) {
    absl::StrAppend(&weight_map, weight_map.empty() ? "" : ",", "\"", HfAttentionPrefix(0), name,
                    "\":\"model-00009-of-00009.safetensors\"");
  }
  WriteBytes(dir + "/model.safetensors.index.json", "{\"weight_map\":{" + weight_map + "}}");
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(dir, GqaSpec(), 0).status(),
                absl::StatusCode::kNotFound, "model-00009-of-00009.safetensors", "the shard that",
                "index.json names for");
}

TEST(LoaderTest, BadIndexFiles) {
  const std::string dir = TestDir();
  const std::string index = dir + "/model.safetensors.index.json";
  WriteBytes(index, "{\"weight_map\": [");
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(dir, GqaSpec(), 0).status(),
                absl::StatusCode::kInvalidArgument, "is not a JSON object");
  WriteBytes(index, "{\"metadata\": {}}");
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(dir, GqaSpec(), 0).status(),
                absl::StatusCode::kInvalidArgument, "no \"weight_map\"");
  WriteBytes(index, "{\"weight_map\": {\"model.layers.0.self_attn.q_proj.weight\": 3}}");
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(dir, GqaSpec(), 0).status(),
                absl::StatusCode::kInvalidArgument, "not a string file name");
  WriteBytes(index,
             "{\"weight_map\": {\"model.layers.0.self_attn.q_proj.weight\": \"../../etc/x\"}}");
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(dir, GqaSpec(), 0).status(),
                absl::StatusCode::kInvalidArgument, "'../../etc/x'", "not a relative path inside");
}

TEST(LoaderTest, InvalidSpecIsRejectedFirst) {
  LayerSpec spec = GqaSpec();
  spec.num_kv_heads = 3;
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors("/nonexistent", spec, 0).status(),
                absl::StatusCode::kInvalidArgument, "num_kv_heads");
}

// ---- Hostile paths: FIFOs, devices, symlinks, files that are not checkpoints -----------------

// Runs `call` on a thread and waits at most 2 s for it. A reader blocked in open() on a FIFO is
// released afterwards by opening the FIFO for writing, so a regression fails the test instead of
// hanging it.
absl::Status OpenWithin2s(const std::function<absl::Status()>& call, const std::string& fifo) {
  std::future<absl::Status> result = std::async(std::launch::async, call);
  if (result.wait_for(std::chrono::seconds(2)) == std::future_status::ready) return result.get();
  for (int i = 0;
       i < 100 && result.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready;
       ++i) {
    const int fd = open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) close(fd);
  }
  return absl::DeadlineExceededError("blocked for more than 2 s");
}

TEST(SafetensorsTest, FifoAndDevicesAreRefusedWithoutBlocking) {
  const std::string dir = TestDir();
  const std::string fifo = dir + "/fifo.safetensors";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  EXPECT_STATUS(OpenWithin2s([&] { return SafetensorsFile::Open(fifo).status(); }, fifo),
                absl::StatusCode::kNotFound, "fifo.safetensors", "not a readable regular file",
                "a FIFO");
  // A device that reads forever, and one that reads nothing.
  EXPECT_STATUS(SafetensorsFile::Open("/dev/zero").status(), absl::StatusCode::kNotFound,
                "a character device");
  EXPECT_STATUS(SafetensorsFile::Open("/dev/null").status(), absl::StatusCode::kNotFound,
                "a character device");
}

TEST(LoaderTest, FifoInsideACheckpointDirectoryDoesNotBlock) {
  const std::string dir = TestDir();
  // model.safetensors is a FIFO.
  const std::string single = dir + "/single";
  fs::create_directories(single);
  ASSERT_EQ(mkfifo((single + "/model.safetensors").c_str(), 0644), 0);
  EXPECT_STATUS(
      OpenWithin2s([&] { return LoadLayerWeightsFromSafetensors(single, GqaSpec(), 0).status(); },
                   single + "/model.safetensors"),
      absl::StatusCode::kNotFound, "a FIFO");
  // The index is a FIFO.
  const std::string sharded = dir + "/sharded";
  fs::create_directories(sharded);
  const std::string index = sharded + "/model.safetensors.index.json";
  ASSERT_EQ(mkfifo(index.c_str(), 0644), 0);
  EXPECT_STATUS(
      OpenWithin2s([&] { return LoadLayerWeightsFromSafetensors(sharded, GqaSpec(), 0).status(); },
                   index),
      absl::StatusCode::kNotFound, "a FIFO");
}

TEST(SafetensorsTest, ErrorsNeverQuoteTheFirstBytesOfAFile) {
  const std::string dir = TestDir();
  // The first line of /etc/shadow. Its first 8 bytes, read as the header length, are a number
  // that decodes back to "root:*:1"; neither the text nor the number may appear.
  const std::string shadow_like = "root:*:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n";
  uint64_t as_length = 0;
  std::memcpy(&as_length, shadow_like.data(), 8);
  // And a file whose first 8 bytes make a plausible length that runs past the end.
  const std::string short_length = U64Le(0x3a2a3a) + "root:*:1";
  // And one whose "header" is not JSON.
  const std::string not_json = U64Le(12) + "root:*:19000";
  int index = 0;
  for (const std::string& bytes : {shadow_like, short_length, not_json}) {
    SCOPED_TRACE(index);
    const std::string path = absl::StrCat(dir, "/secret", index++);
    WriteBytes(path, bytes);
    const absl::Status status = SafetensorsFile::Open(path).status();
    EXPECT_FALSE(status.ok());
    const std::string message(status.message());
    EXPECT_THAT(message, HasSubstr("not a safetensors file"));
    EXPECT_THAT(message, ::testing::Not(HasSubstr("root")));
    EXPECT_THAT(message, ::testing::Not(HasSubstr("19000")));
    EXPECT_THAT(message, ::testing::Not(HasSubstr(absl::StrCat(as_length))));
    EXPECT_THAT(message, ::testing::Not(HasSubstr(absl::StrCat(0x3a2a3a))));
    EXPECT_THAT(message, ::testing::Not(HasSubstr("12-byte")));
  }
}

TEST(SafetensorsTest, LongPathsAreClippedInMessages) {
  const std::string dir = TestDir();
  const std::string long_name(240, 'n');
  const std::string path = dir + "/" + long_name;
  const absl::Status status = SafetensorsFile::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), ::testing::Not(HasSubstr(long_name)));
  EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("(", path.size(), " bytes)")));
}

TEST(ClipForMessageTest, ShortStringsStayAndLongOnesAreCutWithTheirLength) {
  EXPECT_EQ(ClipForMessage("abc"), "abc");
  EXPECT_EQ(ClipForMessage(std::string(200, 'x')), std::string(200, 'x'));
  EXPECT_EQ(ClipForMessage(std::string(201, 'x')), std::string(200, 'x') + "...(201 bytes)");
  EXPECT_EQ(ClipForMessage("abcdef", 3), "abc...(6 bytes)");
  // A two-byte UTF-8 character across the cut is dropped whole.
  EXPECT_EQ(ClipForMessage("ab\xc3\xa9z", 3), "ab...(5 bytes)");
}

TEST(PathConfinementTest, InsideTheRootOnly) {
  const std::string base = TestDir();
  const std::string root = base + "/data";
  fs::create_directories(root + "/sub");
  fs::create_directories(base + "/database");  // Shares the root's name as a prefix.
  WriteBytes(root + "/sub/a", "a");
  WriteBytes(base + "/database/b", "b");
  WriteBytes(base + "/outside", "o");
  fs::create_symlink(root + "/sub/a", root + "/link_in");
  fs::create_symlink(base + "/outside", root + "/link_out");
  fs::create_symlink(base + "/missing", root + "/dangling");
  const std::string real_root = fs::canonical(root).string();

  EXPECT_EQ(ResolveInsideRoot(root, root + "/sub/a"), real_root + "/sub/a");
  EXPECT_EQ(ResolveInsideRoot(root, "sub/a"), real_root + "/sub/a");  // Relative to the root.
  EXPECT_EQ(ResolveInsideRoot(root, root + "/link_in"), real_root + "/sub/a");
  EXPECT_EQ(ResolveInsideRoot(root, root), real_root);
  EXPECT_EQ(ResolveInsideRoot(root, root + "/sub/../sub/a"), real_root + "/sub/a");
  for (const std::string& refused :
       {root + "/link_out", root + "/dangling", root + "/nope", base + "/outside",
        base + "/database/b", root + "/../outside", std::string("../outside"), std::string("/"),
        std::string("/etc/passwd"), std::string("")}) {
    EXPECT_EQ(ResolveInsideRoot(root, refused), std::nullopt) << refused;
  }
  EXPECT_EQ(ResolveInsideRoot(base + "/no_root", base + "/outside"), std::nullopt);
}

TEST(LoaderTest, ConfinedToTheCheckpointRoot) {
  const std::string base = TestDir();
  const std::string root = base + "/root";
  fs::create_directories(root);
  const LayerWeights weights = MixedDTypeWeights(GqaSpec(), 9);
  const std::map<std::string, Tensor> tensors = CheckpointTensors(weights, 0);
  ASSERT_TRUE(WriteSafetensors(base + "/outside.safetensors", tensors).ok());
  ASSERT_TRUE(WriteSafetensors(root + "/inside.safetensors", tensors).ok());

  // Inside, directly and through a symlink that stays inside (the Hugging Face cache layout).
  fs::create_symlink(root + "/inside.safetensors", root + "/link_in.safetensors");
  for (const std::string& path : {root + "/inside.safetensors", root + "/link_in.safetensors",
                                  std::string("inside.safetensors")}) {
    absl::StatusOr<LayerWeights> loaded = LoadLayerWeightsFromSafetensors(path, GqaSpec(), 0, root);
    ASSERT_TRUE(loaded.ok()) << path << ": " << loaded.status();
    ExpectSameWeights(*loaded, weights);
  }

  // Outside, a symlink leading out, and a missing file: one code, one message shape.
  fs::create_symlink(base + "/outside.safetensors", root + "/link_out.safetensors");
  for (const std::string& path : {base + "/outside.safetensors", root + "/link_out.safetensors",
                                  root + "/missing.safetensors"}) {
    EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, GqaSpec(), 0, root).status(),
                  absl::StatusCode::kNotFound,
                  absl::StrCat("'", path, "' is not a readable file under the checkpoint root"));
  }

  // A sharded checkpoint inside the root whose shard is a symlink leading out of it.
  const std::string sharded = root + "/sharded";
  fs::create_directories(sharded);
  fs::create_symlink(base + "/outside.safetensors", sharded + "/model-00001-of-00001.safetensors");
  std::string weight_map;
  for (const auto& [name, tensor] : tensors) {
    absl::StrAppend(&weight_map, weight_map.empty() ? "" : ",", "\"", name,
                    "\":\"model-00001-of-00001.safetensors\"");
  }
  WriteBytes(sharded + "/model.safetensors.index.json", "{\"weight_map\":{" + weight_map + "}}");
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(sharded, GqaSpec(), 0, root).status(),
                absl::StatusCode::kNotFound, "model-00001-of-00001.safetensors",
                "is not a readable file under the checkpoint root");
  // Without a root the same checkpoint loads (the loader's own callers: tools and tests).
  EXPECT_TRUE(LoadLayerWeightsFromSafetensors(sharded, GqaSpec(), 0).ok());

  // An index that is a symlink out of the root gets the same answer whether its target exists or
  // not, so a link cannot be used to probe for files outside.
  for (const std::string& target : {base + "/outside.safetensors", base + "/no_such_file"}) {
    const std::string dir = root + "/index_link_" + std::to_string(target.size());
    fs::create_directories(dir);
    fs::create_symlink(target, dir + "/model.safetensors.index.json");
    EXPECT_STATUS(LoadLayerWeightsFromSafetensors(dir, GqaSpec(), 0, root).status(),
                  absl::StatusCode::kNotFound,
                  absl::StrCat("'", dir,
                               "/model.safetensors.index.json' is not a readable file under the "
                               "checkpoint root"));
  }
}

// ---- Weights must be finite ------------------------------------------------------------------

TEST(LoaderTest, NonFiniteWeightsAreRefusedNamingTensorAndIndex) {
  const LayerSpec spec = GqaSpec();
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, 4);
  ASSERT_TRUE(weights.ok());
  ASSERT_TRUE(ValidateLayerWeights(spec, *weights).ok());
  // f32 NaN at [2, 5] of k_proj.weight ([32, 64]): element 2 * 64 + 5 = 133.
  LayerWeights with_nan = *weights;
  with_nan.at("k_proj.weight").f32()[133] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_STATUS(ValidateLayerWeights(spec, with_nan), absl::StatusCode::kInvalidArgument,
                "weight 'k_proj.weight'", "element 133", "index [2, 5]", "must be finite");
  // +Inf in a bias.
  LayerWeights with_inf = *weights;
  with_inf.at("q_proj.bias").f32()[7] = std::numeric_limits<float>::infinity();
  EXPECT_STATUS(ValidateLayerWeights(spec, with_inf), absl::StatusCode::kInvalidArgument,
                "weight 'q_proj.bias'", "element 7", "index [7]");
  // BF16 -Inf, through a checkpoint.
  const std::string path = WriteEditedCheckpoint([](std::map<std::string, Tensor>& t) {
    Tensor& o = t.at("model.layers.3.self_attn.o_proj.weight");
    o = o.CastTo(DType::kBF16);
    const uint16_t minus_inf = 0xff80;
    std::memcpy(o.data() + 2 * 10, &minus_inf, 2);
  });
  EXPECT_STATUS(LoadLayerWeightsFromSafetensors(path, GqaSpec(), 3).status(),
                absl::StatusCode::kInvalidArgument, "weight 'o_proj.weight'", "element 10");
}

}  // namespace
}  // namespace attnserve

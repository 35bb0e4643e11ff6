// attnctl's .npy reader (client/attnctl/npy.h) on hand-built files: a valid file, and headers whose
// shape does not describe the data (found by tests/fuzz/npy_fuzzer).
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/attnctl/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/core/tensor.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

// A version 1.0 .npy file of '<f4' values with the given shape text and `data_bytes` zero bytes.
std::string NpyFile(const std::string& shape, size_t data_bytes) {
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': ", shape, ", }");
  header.append(63 - (10 + header.size()) % 64, ' ');  // Pads to a multiple of 64, as numpy does.
  header.push_back('\n');
  std::string file("\x93NUMPY\x01\x00", 8);
  file.push_back(static_cast<char>(header.size() & 0xff));
  file.push_back(static_cast<char>(header.size() >> 8));
  return file + header + std::string(data_bytes, '\0');
}

TEST(ParseNpyTest, ReadsAValidFile) {
  absl::StatusOr<Tensor> tensor = ParseNpy(NpyFile("(2, 3)", 2 * 3 * 4));
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->dtype(), DType::kF32);
  EXPECT_EQ(tensor->shape(), (std::vector<int64_t>{2, 3}));
}

TEST(ParseNpyTest, AcceptsAZeroDimensionBesideAHugeOne) {
  // Zero elements, whatever the other dimensions: numpy writes such files with no data.
  absl::StatusOr<Tensor> tensor = ParseNpy(NpyFile("(1099511627776, 0)", 0));
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->num_elements(), 0);
}

TEST(ParseNpyTest, AcceptsAZeroDimensionAfterDimensionsWhoseProductOverflows) {
  // The fuzzer's file: the dimensions before the 0 multiply past int64 (undefined behaviour in the
  // tensor's element count until the count looked for an empty dimension first).
  absl::StatusOr<Tensor> tensor =
      ParseNpy(NpyFile("(1, 41, 40, 81, 40, 8, 6840, 8, 5, 81, 40, 8, 1, 40, 0, 8)", 0));
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->num_elements(), 0);
}

TEST(ParseNpyTest, RejectsAShapeWhoseElementCountOverflows) {
  // 2^62 * 4 elements wrapped around to 0 in int64 (undefined behaviour), which matched the empty
  // data region: the reader accepted a tensor whose shape claimed 2^64 elements.
  absl::StatusOr<Tensor> tensor = ParseNpy(NpyFile("(4611686018427387904, 4)", 0));
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(), HasSubstr("needs more data than the file's 0 bytes"));
}

TEST(ParseNpyTest, RejectsAShapeLargerThanTheData) {
  absl::StatusOr<Tensor> tensor = ParseNpy(NpyFile("(1000000, 1000000)", 16));
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(), HasSubstr("needs more data than the file's 16 bytes"));
}

TEST(ParseNpyTest, RejectsDataThatDoesNotMatchTheShape) {
  absl::StatusOr<Tensor> tensor = ParseNpy(NpyFile("(2, 3)", 2 * 3 * 4 + 1));
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tensor.status().message(), HasSubstr("needs 24 data bytes, the file has 25"));
}

}  // namespace
}  // namespace attnserve

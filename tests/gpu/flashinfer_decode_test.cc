// FlashInfer's decode kernel (kernels/cuda/flashinfer/paged_decode.h) on a real GPU, over pages in
// our layout, against float64: bf16 and f16 KV, head dims 64/128/256, GQA groups 1/4/8, lengths
// crossing page edges (1, 15, 16, 17, 200, 1000), pages scattered over a NaN-poisoned pool, and a
// sliding window whose evicted leading pages are left out of the page list. Without a device every
// case skips ("FlashInfer decode: SKIPPED", which ctest reports as a skip).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/flashinfer/paged_decode.h"
#include "tests/gpu/emulation_support.h"

namespace attnserve::cuda {
namespace {

using emulation::CompareWithReference;
using emulation::DrawCaseSeed;
using emulation::ElementBytes;
using emulation::LoadElement;
using emulation::MakePagedBatch;
using emulation::PagedBatch;
using emulation::SequenceShape;
using emulation::StoreElement;

bool HaveDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Device copy of a host vector, freed with the object.
class DeviceBuffer {
 public:
  DeviceBuffer(const void* host, size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&data_, bytes_ == 0 ? 1 : bytes_), cudaSuccess);
    if (host != nullptr && bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

struct DecodeCase {
  KvType type;
  int head_dim;
  int kv_heads;
  int group;
  int window;  // 0 = none.
  std::vector<int> lengths;
};

std::string CaseName(const DecodeCase& c) {
  return absl::StrCat(c.type == KvType::kBF16 ? "bf16" : "f16", "_hd", c.head_dim, "_kv",
                      c.kv_heads, "_g", c.group, c.window > 0 ? absl::StrCat("_w", c.window) : "");
}

// bf16 keeps 8 significant bits: outputs are rounded to it (2^-9 relative), plus accumulation in
// fp32 over up to 1000 keys; f16 keeps 11.
double Tolerance(KvType type) { return type == KvType::kBF16 ? 8e-3 : 1e-3; }

void RunCase(const DecodeCase& c) {
  constexpr int kPageSize = 16;
  const int heads = c.kv_heads * c.group;
  std::mt19937_64 rng(DrawCaseSeed(CaseName(c)));
  std::vector<SequenceShape> shapes;
  for (int length : c.lengths) shapes.push_back({length - 1, 1});
  MaskSpec mask;
  mask.causal = 1;
  mask.window = c.window;
  PagedBatch batch =
      MakePagedBatch(shapes, c.type, c.kv_heads, c.head_dim, kPageSize, mask, rng);
  const int64_t page_bytes = batch.PageElements() * ElementBytes(c.type);

  // FlashInfer's page list: page indices from the first page still in the window.
  std::vector<int32_t> indptr = {0}, page_indices, last_page_len;
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const SequenceDesc& s = batch.sequences[b];
    const int pages = (s.length + kPageSize - 1) / kPageSize;
    for (int p = 0; p < pages; ++p) {
      const int64_t offset = batch.page_offsets[s.first_page + p];
      if (offset < 0) {
        ASSERT_TRUE(page_indices.size() == static_cast<size_t>(indptr.back()))
            << "an evicted page after a live one";
        continue;
      }
      ASSERT_EQ(offset % page_bytes, 0);
      page_indices.push_back(static_cast<int32_t>(offset / page_bytes));
    }
    indptr.push_back(static_cast<int32_t>(page_indices.size()));
    last_page_len.push_back(s.length - (pages - 1) * kPageSize);
  }

  // Queries rounded to the KV type (FlashInfer reads q in it); the reference gets the rounded ones.
  const int64_t q_stride = int64_t{heads} * c.head_dim;
  std::vector<float> q_rounded(batch.rows * q_stride);
  std::vector<uint8_t> q_device_bytes(q_rounded.size() * ElementBytes(c.type));
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < q_rounded.size(); ++i) {
    q_rounded[i] = static_cast<float>(
        StoreElement(normal(rng), c.type, q_device_bytes.data() + i * ElementBytes(c.type)));
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const std::vector<double> expected =
      emulation::ReferenceAttention(batch, q_rounded.data(), q_stride, heads, c.group, scale);

  DeviceBuffer pool(batch.pool.data(), batch.pool.size() * sizeof(uint32_t));
  DeviceBuffer q(q_device_bytes.data(), q_device_bytes.size());
  DeviceBuffer out(nullptr, q_device_bytes.size());
  DeviceBuffer d_indptr(indptr.data(), indptr.size() * sizeof(int32_t));
  DeviceBuffer d_pages(page_indices.data(), page_indices.size() * sizeof(int32_t));
  DeviceBuffer d_last(last_page_len.data(), last_page_len.size() * sizeof(int32_t));
  const std::vector<int32_t> schedule = FlashInferDecodeSchedule(static_cast<int>(shapes.size()));
  DeviceBuffer d_schedule(schedule.data(), schedule.size() * sizeof(int32_t));

  FlashInferDecodeArgs args;
  args.kv_type = c.type;
  args.head_dim = c.head_dim;
  args.num_heads = heads;
  args.num_kv_heads = c.kv_heads;
  args.page_size = kPageSize;
  args.batch = static_cast<int>(shapes.size());
  args.q = q.get();
  args.out = out.get();
  args.pool = pool.get();
  args.indptr = static_cast<int32_t*>(d_indptr.get());
  args.page_indices = static_cast<int32_t*>(d_pages.get());
  args.last_page_len = static_cast<int32_t*>(d_last.get());
  args.schedule = static_cast<int32_t*>(d_schedule.get());
  args.window = c.window;
  args.sm_scale = static_cast<float>(scale);
  ASSERT_TRUE(FlashInferDecodeSupports(c.type, c.head_dim, c.group));
  ASSERT_EQ(FlashInferDecode(args, /*stream=*/0), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint8_t> out_bytes(q_device_bytes.size());
  ASSERT_EQ(cudaMemcpy(out_bytes.data(), out.get(), out_bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  // Output row b is sequence b; the reference's rows are the sequences' first_row.
  std::vector<float> actual(expected.size());
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const int row = batch.sequences[b].first_row;
    for (int64_t i = 0; i < q_stride; ++i) {
      actual[row * q_stride + i] = static_cast<float>(LoadElement(
          out_bytes.data() + (b * q_stride + i) * ElementBytes(c.type), c.type));
    }
  }
  const emulation::OutputError error = CompareWithReference(actual, expected);
  std::printf("[flashinfer] %-24s rel err %.2e (bound %.0e)\n", CaseName(c).c_str(),
              error.relative, Tolerance(c.type));
  EXPECT_EQ(error.nan_count, 0);
  EXPECT_LE(error.relative, Tolerance(c.type));
}

class FlashInferDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) {
      std::printf("FlashInfer decode: SKIPPED (no CUDA device)\n");
      GTEST_SKIP() << "no CUDA device";
    }
  }
};

const std::vector<int> kLengths = {1, 15, 16, 17, 200, 1000};

TEST_F(FlashInferDecodeTest, HeadDimsAndGroups) {
  for (KvType type : {KvType::kBF16, KvType::kF16}) {
    for (int head_dim : {64, 128, 256}) {
      for (int group : {1, 4, 8}) {
        SCOPED_TRACE(CaseName({type, head_dim, 2, group, 0, {}}));
        RunCase({type, head_dim, /*kv_heads=*/2, group, /*window=*/0, kLengths});
      }
    }
  }
}

TEST_F(FlashInferDecodeTest, SlidingWindowWithEvictedPages) {
  for (int window : {1, 16, 33}) {
    SCOPED_TRACE(window);
    RunCase({KvType::kBF16, 128, /*kv_heads=*/2, /*group=*/4, window, kLengths});
  }
}

TEST(FlashInferDecodeShapes, UnsupportedShapesAreRefused) {
  EXPECT_FALSE(FlashInferDecodeSupports(KvType::kF32, 128, 4));
  EXPECT_FALSE(FlashInferDecodeSupports(KvType::kBF16, 96, 4));
  EXPECT_FALSE(FlashInferDecodeSupports(KvType::kBF16, 128, 16));
  FlashInferDecodeArgs args;
  args.kv_type = KvType::kBF16;
  args.head_dim = 128;
  args.num_heads = 32;
  args.num_kv_heads = 2;  // Group 16: no decode instance.
  args.page_size = 16;
  args.batch = 1;
  EXPECT_EQ(FlashInferDecode(args, 0), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace attnserve::cuda

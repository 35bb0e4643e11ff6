// attention_kernel_bench: the CUDA attention kernels alone, each rate printed as a ratio against a
// ceiling measured in the same run on the same device (the project's rule for speed claims).
//
//   attention_kernel_bench [--quick] [--csv PATH]
//
// What is timed: RunDecodeAttention (split-KV decode kernel + combine kernel) and
// RunPrefillAttention (tensor-core mma.sync prefill for f16/bf16 pages, CUDA-core prefill for f32
// pages), called exactly as kernels/cuda/layer/cuda_layer.cc calls them: same work plan
// (PlanDecodeSplits / PlanPrefillItems, the same split count rule), same q layout (fp32 rows of
// the fused qkv width), 16-token pages in a shuffled order. Inputs are built directly on the
// device; no projection, host planning, upload or download is inside the timed region. Each
// sample: the L2 is flushed (a memset of 4x its size, untimed), then cudaEvents around one call;
// the figure is the median of the samples after a warm-up.
//
// Ceilings, same run: device-to-device cudaMemcpy bandwidth (bytes read + bytes written), a
// read-only sweep kernel (bytes read), cuBLAS GemmEx bf16 and f16 (fp32 accumulation and output)
// and cuBLAS Sgemm (plain fp32, no TF32) TFLOP/s. Decode is rated in KV bytes read per second:
// every visible key's K and V rows once per KV head (the least any kernel must read; q, partials
// and the output are not counted). Prefill is rated in attention FLOPs per second:
// 4 * head_dim per (query head, query token, visible key), causal and sliding-window masks counted
// exactly (masked pairs are not work).
//
// Where FlashInfer's headers were found at build time (ATTNSERVE_BENCH_FLASHINFER), every bf16/f16
// decode case also times FlashInfer's paged decode (tests/gpu/flashinfer_decode_bench.h) on the
// same pages and q values (rounded to the page type), same timing, same KV byte count; its row
// follows ours with its time over ours. Likewise every bf16/f16 prefill case times FlashInfer's
// paged prefill (tests/gpu/flashinfer_prefill_bench.h): same pages, same q values (rounded), same
// timing, same FLOP count.
//
// --csv writes every measured row (ceilings included) for tests/gpu/torch_peer_bench.py --ours.
// Without a usable device it prints "no usable CUDA device, benchmark skipped: <reason>" and
// exits 0. Exit 1 when a measurement failed.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/core/tensor.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/runtime/cublas_api.h"
#include "kernels/cuda/runtime/cuda_device.h"
#include "kernels/cuda/runtime/cuda_status.h"
#include "tests/gpu/bench_device_kernels.h"
#include "tests/gpu/mla_decode_bench.h"
#if ATTNSERVE_BENCH_FLASHINFER
#include "tests/gpu/flashinfer_decode_bench.h"
#include "tests/gpu/flashinfer_prefill_bench.h"
#endif

namespace attnserve {
namespace {

using cuda::AttentionParams;
using cuda::KvType;
using cuda::MaskSpec;
using cuda::PagedKv;
using cuda::SequenceDesc;
using cuda::WorkItem;

// DefaultPageSize for GQA, MHA and MQA (kernels/spec/layer_spec.cc).
constexpr int kPageSize = 16;
// Seed of the q fill (FlashInfer's 16-bit q reuses it: the same values, rounded).
constexpr uint64_t kQuerySeed = 0x0123;

#define BENCH_RETURN_IF_ERROR(expr)                    \
  do {                                                 \
    if (absl::Status _s = (expr); !_s.ok()) return _s; \
  } while (0)

// ---- RAII wrappers (every CUDA return code checked; destructors report failures) --------------

class DeviceMem {
 public:
  DeviceMem() = default;
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  ~DeviceMem() {
    if (ptr_ == nullptr) return;
    if (cudaError_t e = cudaFree(ptr_); e != cudaSuccess) {
      std::fprintf(stderr, "cudaFree: %s\n", cudaGetErrorString(e));
    }
  }
  absl::Status Allocate(size_t bytes, const char* what) {
    if (ptr_ != nullptr) return absl::InternalError("DeviceMem allocated twice");
    ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)),
                                   absl::StrCat("cudaMalloc ", bytes, " bytes for ", what));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  // Allocates and copies `count` elements of `host`.
  template <typename T>
  absl::Status Upload(const std::vector<T>& host, const char* what) {
    BENCH_RETURN_IF_ERROR(Allocate(sizeof(T) * host.size(), what));
    if (host.empty()) return absl::OkStatus();
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(ptr_, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice),
        absl::StrCat("uploading ", what));
    return absl::OkStatus();
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Stream {
 public:
  ~Stream() {
    if (stream_ == nullptr) return;
    if (cudaError_t e = cudaStreamDestroy(stream_); e != cudaSuccess) {
      std::fprintf(stderr, "cudaStreamDestroy: %s\n", cudaGetErrorString(e));
    }
  }
  absl::Status Create() {
    return cuda::CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                            "cudaStreamCreate");
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  ~Event() {
    if (event_ == nullptr) return;
    if (cudaError_t e = cudaEventDestroy(event_); e != cudaSuccess) {
      std::fprintf(stderr, "cudaEventDestroy: %s\n", cudaGetErrorString(e));
    }
  }
  absl::Status Create() { return cuda::CudaStatus(cudaEventCreate(&event_), "cudaEventCreate"); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class CublasHandle {
 public:
  ~CublasHandle() {
    if (handle_ != nullptr) {
      if (cublasStatus_t s = api_->destroy(handle_); s != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasDestroy: status %d\n", static_cast<int>(s));
      }
    }
  }
  absl::Status Create(const cuda::CublasApi* api, cudaStream_t stream) {
    api_ = api;
    if (absl::Status s = cuda::CublasStatus(api->create(&handle_), "cublasCreate"); !s.ok()) {
      handle_ = nullptr;
      return s;
    }
    BENCH_RETURN_IF_ERROR(cuda::CublasStatus(api->set_stream(handle_, stream), "cublasSetStream"));
    // Tensor cores for 16-bit inputs (allowed by default since CUDA 11); plain fp32 for Sgemm.
    return cuda::CublasStatus(api->set_math_mode(handle_, CUBLAS_DEFAULT_MATH), "math mode");
  }
  cublasHandle_t get() const { return handle_; }

 private:
  const cuda::CublasApi* api_ = nullptr;
  cublasHandle_t handle_ = nullptr;
};

// ---- Timing -------------------------------------------------------------------------------------

struct Timer {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  void* flush = nullptr;  // Written before every sample (untimed) so each sample starts cold.
  size_t flush_bytes = 0;
  int warmup = 3;
  int samples = 20;

  // Median milliseconds of one call of `launch` (which only enqueues work on `stream`).
  absl::StatusOr<double> MedianMs(const std::function<absl::Status()>& launch) const {
    for (int i = 0; i < warmup; ++i) BENCH_RETURN_IF_ERROR(launch());
    ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "warm-up");
    std::vector<double> ms;
    for (int i = 0; i < samples; ++i) {
      if (flush_bytes > 0) {
        ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, stream),
                                       "L2 flush");
      }
      ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream), "cudaEventRecord");
      BENCH_RETURN_IF_ERROR(launch());
      ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream), "cudaEventRecord");
      ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop), "timed sample");
      float elapsed = 0.0f;
      ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&elapsed, start, stop),
                                     "cudaEventElapsedTime");
      ms.push_back(elapsed);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
};

// ---- Results ------------------------------------------------------------------------------------

// One measured row; `work` is bytes (decode, copy, read) or FLOPs (prefill, GEMM).
struct Row {
  std::string kind;  // "ceiling", "decode" or "prefill".
  std::string name;
  std::string dtype;
  int heads = 0, kv_heads = 0, head_dim = 0, batch = 0, tokens = 0, window = 0;
  int items = 0;  // Work items (thread blocks along grid.x) the plan made.
  double ms = 0.0;
  double work = 0.0;
  double Rate() const { return ms > 0.0 ? work / (ms * 1e-3) : 0.0; }
};

std::string Ratio(double rate, std::optional<double> ceiling) {
  if (!ceiling.has_value() || *ceiling <= 0.0) return "n/a";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f%%", 100.0 * rate / *ceiling);
  return buffer;
}

// ---- Cases --------------------------------------------------------------------------------------

struct Shape {
  const char* name;
  int heads, kv_heads, head_dim;
  DType dtype;
};

constexpr Shape kGqa{"gqa32x8_hd128_bf16", 32, 8, 128, DType::kBF16};
constexpr Shape kMha{"mha32_hd128_bf16", 32, 32, 128, DType::kBF16};
constexpr Shape kMqa{"mqa32_hd64_f16", 32, 1, 64, DType::kF16};
constexpr Shape kGqaF32{"gqa32x8_hd128_f32", 32, 8, 128, DType::kF32};

// Decode: `batch` sequences of `tokens` cached tokens (the new one included), one query each.
// Prefill: `batch` sequences of `tokens` new tokens from position 0, causal.
struct Case {
  Shape shape;
  int batch;
  int tokens;
  int window;  // Sliding window in tokens; 0 = none.
};

std::vector<Case> DecodeCases(bool quick) {
  if (quick) {
    return {{kGqa, 8, 1024, 0},
            {kGqa, 4, 2048, 1024},
            {kMha, 4, 1024, 0},
            {kMqa, 16, 1024, 0},
            {kGqaF32, 4, 512, 0}};
  }
  return {{kGqa, 8, 1024, 0},  {kGqa, 32, 1024, 0},  {kGqa, 8, 4096, 0},     {kGqa, 32, 4096, 0},
          {kGqa, 8, 8192, 0},  {kGqa, 32, 8192, 0},  {kGqa, 16, 8192, 4096}, {kMha, 8, 4096, 0},
          {kMqa, 64, 8192, 0}, {kGqaF32, 8, 2048, 0}};
}

std::vector<Case> PrefillCases(bool quick) {
  if (quick) {
    return {{kGqa, 1, 512, 0},
            {kGqa, 1, 1024, 256},
            {kMha, 1, 512, 0},
            {kMqa, 1, 512, 0},
            {kGqaF32, 1, 256, 0}};
  }
  return {{kGqa, 1, 1024, 0},    {kGqa, 1, 2048, 0}, {kGqa, 1, 4096, 0}, {kGqa, 4, 2048, 0},
          {kGqa, 1, 4096, 1024}, {kMha, 1, 4096, 0}, {kMqa, 1, 4096, 0}, {kGqaF32, 1, 1024, 0}};
}

// Keys visible to query index `query` of a `length`-token sequence.
int64_t VisibleCount(const MaskSpec& mask, int query, int length) {
  int begin = 0, end = 0;
  mask.VisibleKeys(query, length, &begin, &end);
  return std::max(0, end - begin);
}

struct DeviceInfo {
  std::string name;
  int compute_capability = 0;
  int multiprocessors = 0;
  int64_t l2_bytes = 0;
  int64_t memory_bytes = 0;
};

// The device inputs of one attention call, built and planned as CudaGqaLayer::Compute does.
class AttentionSetup {
 public:
  absl::Status Build(const Case& c, bool decode, const DeviceInfo& device, cudaStream_t stream) {
    const Shape& s = c.shape;
    const int group = s.heads / s.kv_heads;
    row_blocks_ = (group + cuda::kAttentionRowsPerBlock - 1) / cuda::kAttentionRowsPerBlock;
    const int64_t elem = static_cast<int64_t>(DTypeSize(s.dtype));
    const int64_t page_bytes = int64_t{2} * s.kv_heads * kPageSize * s.head_dim * elem;
    const int pages_per_seq = (c.tokens + kPageSize - 1) / kPageSize;
    const int64_t num_pages = int64_t{c.batch} * pages_per_seq;
    const MaskSpec mask{1, c.window};

    // Page pool: random finite values in every K and V row; pages handed out in shuffled order,
    // as an allocator serving many sequences would.
    BENCH_RETURN_IF_ERROR(pool_.Allocate(static_cast<size_t>(num_pages * page_bytes), "KV pages"));
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        bench::LaunchFillUniform(pool_.get(), cuda::ToKvType(s.dtype),
                                 num_pages * page_bytes / elem, 0x5EED, 1.0f, stream),
        "filling KV pages");
    std::vector<int64_t> page_offsets(static_cast<size_t>(num_pages));
    std::iota(page_offsets.begin(), page_offsets.end(), int64_t{0});
    std::shuffle(page_offsets.begin(), page_offsets.end(), std::mt19937_64(17));
    for (int64_t& offset : page_offsets) offset *= page_bytes;

    // Plan: rows, sequences, work items (decode splits from the SM count, as the layer does).
    const int64_t rows = decode ? c.batch : int64_t{c.batch} * c.tokens;
    std::vector<SequenceDesc> descs;
    std::vector<WorkItem> items;
    std::vector<int> item_begin;
    const int64_t wanted_splits =
        cuda::DecodeSplitsForTwoWaves(c.batch, s.kv_heads, row_blocks_, device.multiprocessors);
    const int prefill_rows = cuda::PrefillRowsPerBlock(s.dtype, s.head_dim);
    work_ = 0.0;
    for (int b = 0; b < c.batch; ++b) {
      SequenceDesc desc;
      desc.first_row = decode ? b : b * c.tokens;
      desc.num_new = decode ? 1 : c.tokens;
      desc.first_index = decode ? c.tokens - 1 : 0;
      desc.length = c.tokens;
      desc.first_page = b * pages_per_seq;
      descs.push_back(desc);
      item_begin.push_back(static_cast<int>(items.size()));
      if (decode) {
        cuda::PlanDecodeSplits(desc, b, mask, wanted_splits, kDecodeMinKeysPerSplit, items);
        // K and V rows of every visible key, once per KV head.
        work_ += static_cast<double>(VisibleCount(mask, c.tokens - 1, c.tokens)) * s.kv_heads *
                 2.0 * s.head_dim * static_cast<double>(elem);
      } else {
        cuda::PlanPrefillItems(desc, b, group, mask, prefill_rows, items);
        int64_t pairs = 0;  // (query token, visible key) pairs of this sequence.
        for (int t = 0; t < c.tokens; ++t) pairs += VisibleCount(mask, t, c.tokens);
        work_ += 4.0 * s.head_dim * s.heads * static_cast<double>(pairs);
      }
    }
    item_begin.push_back(static_cast<int>(items.size()));
    num_items_ = static_cast<int>(items.size());
    out_count_ = rows * s.heads * s.head_dim;

    const int64_t q_stride = int64_t{s.heads + 2 * s.kv_heads} * s.head_dim;  // Fused qkv rows.
    BENCH_RETURN_IF_ERROR(q_.Allocate(sizeof(float) * rows * q_stride, "q"));
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        bench::LaunchFillUniform(q_.get(), KvType::kF32, rows * q_stride, kQuerySeed, 1.0f, stream),
        "filling q");
    BENCH_RETURN_IF_ERROR(out_.Allocate(sizeof(float) * out_count_, "output"));
    BENCH_RETURN_IF_ERROR(page_table_.Upload(page_offsets, "page table"));
    page_offsets_ = page_offsets;
    BENCH_RETURN_IF_ERROR(sequences_.Upload(descs, "sequences"));
    BENCH_RETURN_IF_ERROR(items_.Upload(items, "work items"));
    BENCH_RETURN_IF_ERROR(item_begin_.Upload(item_begin, "item_begin"));
    const int64_t partial_rows = decode ? int64_t{num_items_} * s.heads : 0;
    BENCH_RETURN_IF_ERROR(pmax_.Allocate(sizeof(float) * partial_rows, "partial max"));
    BENCH_RETURN_IF_ERROR(psum_.Allocate(sizeof(float) * partial_rows, "partial sum"));
    BENCH_RETURN_IF_ERROR(
        pacc_.Allocate(sizeof(float) * partial_rows * s.head_dim, "partial accumulators"));
    ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "building inputs");

    PagedKv kv;
    kv.pool = pool_.get();
    kv.page_offsets = page_table_.as<const int64_t>();
    kv.page_size = kPageSize;
    kv.num_kv_heads = s.kv_heads;
    kv.head_dim = s.head_dim;
    params_.q = q_.as<const float>();
    params_.q_stride = q_stride;
    params_.out = out_.as<float>();
    params_.num_heads = s.heads;
    params_.group = group;
    params_.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    params_.mask = mask;
    params_.kv = kv;
    params_.sequences = sequences_.as<const SequenceDesc>();
    params_.batch = c.batch;
    params_.items = items_.as<const WorkItem>();
    params_.num_items = num_items_;
    if (decode) {
      params_.partial_max = pmax_.as<float>();
      params_.partial_sum = psum_.as<float>();
      params_.partial_acc = pacc_.as<float>();
      params_.item_begin = item_begin_.as<const int>();
    }
    return absl::OkStatus();
  }

  const AttentionParams& params() const { return params_; }
  void* pool() const { return pool_.get(); }
  const std::vector<int64_t>& page_offsets() const { return page_offsets_; }
  int row_blocks() const { return row_blocks_; }
  int num_items() const { return num_items_; }
  double work() const { return work_; }

  cudaError_t PoisonOutput() const {
    return cudaMemset(out_.get(), 0xFF, sizeof(float) * out_count_);
  }

  // Number of non-finite output values (a sanity check that the timed kernels did real work).
  absl::StatusOr<int64_t> CountNonFinite() const {
    std::vector<float> host(static_cast<size_t>(out_count_));
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(host.data(), out_.get(), sizeof(float) * host.size(), cudaMemcpyDeviceToHost),
        "downloading the output");
    int64_t bad = 0;
    for (float x : host) bad += std::isfinite(x) ? 0 : 1;
    return bad;
  }

 private:
  DeviceMem pool_, q_, out_, page_table_, sequences_, items_, item_begin_, pmax_, psum_, pacc_;
  std::vector<int64_t> page_offsets_;  // Bytes from the pool base, sequence-major.
  AttentionParams params_;
  int row_blocks_ = 1;
  int num_items_ = 0;
  int64_t out_count_ = 0;
  double work_ = 0.0;
};

absl::StatusOr<Row> RunAttentionCase(const Case& c, bool decode, const DeviceInfo& device,
                                     const Timer& timer) {
  AttentionSetup setup;
  BENCH_RETURN_IF_ERROR(setup.Build(c, decode, device, timer.stream));
  // 0xFF bytes are NaN: an output row no kernel wrote fails the finiteness check below.
  ATTNSERVE_CUDA_RETURN_IF_ERROR(setup.PoisonOutput(), "poisoning the output");
  const DType dtype = c.shape.dtype;
  const int head_dim = c.shape.head_dim;
  absl::StatusOr<double> ms = timer.MedianMs([&]() -> absl::Status {
    if (decode) {
      return cuda::RunDecodeAttention(dtype, head_dim, setup.params(), setup.row_blocks(),
                                      timer.stream);
    }
    return cuda::RunPrefillAttention(dtype, head_dim, setup.params(), timer.stream);
  });
  if (!ms.ok()) return ms.status();
  absl::StatusOr<int64_t> bad = setup.CountNonFinite();
  if (!bad.ok()) return bad.status();
  if (*bad > 0) {
    return absl::InternalError(absl::StrCat(*bad, " non-finite output values"));
  }
  Row row;
  row.kind = decode ? "decode" : "prefill";
  row.name = c.shape.name;
  row.dtype = std::string(DTypeName(dtype));
  row.heads = c.shape.heads;
  row.kv_heads = c.shape.kv_heads;
  row.head_dim = head_dim;
  row.batch = c.batch;
  row.tokens = c.tokens;
  row.window = c.window;
  row.items = setup.num_items();
  row.ms = *ms;
  row.work = setup.work();
  return row;
}

#if ATTNSERVE_BENCH_FLASHINFER
// FlashInfer's paged decode or prefill on the inputs RunAttentionCase builds for `c` (the same
// seeds: same pages in the same order, same q values rounded to the page type), timed by the same
// timer and charged the same work (KV bytes or FLOPs) as ours.
absl::StatusOr<Row> RunFlashInferCase(const Case& c, bool decode, const DeviceInfo& device,
                                      const Timer& timer) {
  AttentionSetup setup;
  BENCH_RETURN_IF_ERROR(setup.Build(c, decode, device, timer.stream));
  bench::FlashInferBenchInputs in;
  in.kv_type = cuda::ToKvType(c.shape.dtype);
  in.heads = c.shape.heads;
  in.kv_heads = c.shape.kv_heads;
  in.head_dim = c.shape.head_dim;
  in.page_size = kPageSize;
  in.batch = c.batch;
  in.tokens = c.tokens;
  in.window = c.window;
  in.pool = setup.pool();
  in.page_offsets = &setup.page_offsets();
  in.q_stride = setup.params().q_stride;
  in.q_seed = kQuerySeed;
  const bench::MedianMsFn median_ms = [&](const std::function<absl::Status()>& launch) {
    return timer.MedianMs(launch);
  };
  absl::StatusOr<bench::FlashInferTiming> t =
      decode ? bench::TimeFlashInferDecode(in, median_ms, timer.stream)
             : bench::TimeFlashInferPrefill(in, median_ms, timer.stream);
  if (!t.ok()) return t.status();
  Row row;
  row.kind = decode ? "flashinfer_decode" : "flashinfer_prefill";
  row.name = c.shape.name;
  row.dtype = std::string(DTypeName(c.shape.dtype));
  row.heads = c.shape.heads;
  row.kv_heads = c.shape.kv_heads;
  row.head_dim = c.shape.head_dim;
  row.batch = c.batch;
  row.tokens = c.tokens;
  row.window = c.window;
  row.items = t->items;
  row.ms = t->ms;
  row.work = setup.work();
  return row;
}
#endif

// ---- Ceilings -----------------------------------------------------------------------------------

// Device-to-device cudaMemcpy of `bytes`: work = bytes read + bytes written.
absl::StatusOr<Row> CopyCeiling(size_t bytes, const Timer& timer) {
  DeviceMem src, dst;
  BENCH_RETURN_IF_ERROR(src.Allocate(bytes, "copy source"));
  BENCH_RETURN_IF_ERROR(dst.Allocate(bytes, "copy destination"));
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src.get(), 1, bytes, timer.stream), "memset");
  absl::StatusOr<double> ms = timer.MedianMs([&]() {
    return cuda::CudaStatus(
        cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, timer.stream),
        "cudaMemcpyAsync D2D");
  });
  if (!ms.ok()) return ms.status();
  Row row;
  row.kind = "ceiling";
  row.name = "copy_d2d";
  row.tokens = static_cast<int>(bytes >> 20);  // MiB, for the record.
  row.ms = *ms;
  row.work = 2.0 * static_cast<double>(bytes);
  return row;
}

// The read-only sweep kernel over `bytes`: work = bytes read.
absl::StatusOr<Row> ReadCeiling(size_t bytes, const DeviceInfo& device, const Timer& timer) {
  DeviceMem src, sink;
  BENCH_RETURN_IF_ERROR(src.Allocate(bytes, "read sweep buffer"));
  BENCH_RETURN_IF_ERROR(sink.Allocate(sizeof(unsigned), "read sweep sink"));
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(src.get(), 1, bytes, timer.stream), "memset");
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sink.get(), 0, sizeof(unsigned), timer.stream),
                                 "memset");
  // 4 blocks of 512 threads per SM: 2048 resident threads, the sm_80/sm_90 maximum.
  const int blocks = 4 * device.multiprocessors;
  absl::StatusOr<double> ms = timer.MedianMs([&]() {
    return cuda::CudaStatus(bench::LaunchReadSweep(src.get(), static_cast<int64_t>(bytes),
                                                   sink.as<unsigned>(), blocks, timer.stream),
                            "read sweep launch");
  });
  if (!ms.ok()) return ms.status();
  Row row;
  row.kind = "ceiling";
  row.name = "read_sweep";
  row.tokens = static_cast<int>(bytes >> 20);
  row.ms = *ms;
  row.work = static_cast<double>(bytes);
  return row;
}

// C[n, n] = A[n, n] B[n, n]: GemmEx with `dtype` inputs, fp32 accumulation and fp32 output
// (the project's projection configuration), or Sgemm for f32. work = 2 n^3.
absl::StatusOr<Row> GemmCeiling(DType dtype, int n, const cuda::CublasApi& api,
                                cublasHandle_t handle, const Timer& timer) {
  const size_t elem = DTypeSize(dtype);
  const size_t count = size_t{static_cast<size_t>(n)} * n;
  DeviceMem a, b, c;
  BENCH_RETURN_IF_ERROR(a.Allocate(elem * count, "GEMM A"));
  BENCH_RETURN_IF_ERROR(b.Allocate(elem * count, "GEMM B"));
  BENCH_RETURN_IF_ERROR(c.Allocate(sizeof(float) * count, "GEMM C"));
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      bench::LaunchFillUniform(a.get(), cuda::ToKvType(dtype), count, 1, 1.0f, timer.stream),
      "filling GEMM A");
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      bench::LaunchFillUniform(b.get(), cuda::ToKvType(dtype), count, 2, 1.0f, timer.stream),
      "filling GEMM B");
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType type = dtype == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
  absl::StatusOr<double> ms = timer.MedianMs([&]() -> absl::Status {
    if (dtype == DType::kF32) {
      return cuda::CublasStatus(
          api.sgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.as<const float>(), n,
                    b.as<const float>(), n, &zero, c.as<float>(), n),
          "cublasSgemm");
    }
    return cuda::CublasStatus(api.gemm_ex(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.get(),
                                          type, n, b.get(), type, n, &zero, c.get(), CUDA_R_32F, n,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                              "cublasGemmEx");
  });
  if (!ms.ok()) return ms.status();
  Row row;
  row.kind = "ceiling";
  row.name = dtype == DType::kF32 ? "sgemm_f32" : absl::StrCat("gemm_", DTypeName(dtype));
  row.dtype = std::string(DTypeName(dtype));
  row.tokens = n;
  row.ms = *ms;
  row.work = 2.0 * n * static_cast<double>(n) * n;
  return row;
}

// ---- Output -------------------------------------------------------------------------------------

void WriteCsv(const std::string& path, const std::vector<Row>& rows) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f, "kind,case,dtype,heads,kv_heads,head_dim,batch,tokens,window,items,ms,work\n");
  for (const Row& r : rows) {
    std::fprintf(f, "%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%.6f,%.6e\n", r.kind.c_str(), r.name.c_str(),
                 r.dtype.c_str(), r.heads, r.kv_heads, r.head_dim, r.batch, r.tokens, r.window,
                 r.items, r.ms, r.work);
  }
  std::fclose(f);
}

struct Options {
  bool quick = false;
  std::string csv;
};

int Run(const Options& options) {
  absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  if (!devices.ok()) {
    std::printf("no usable CUDA device, benchmark skipped: %s\n",
                std::string(devices.status().message()).c_str());
    return 0;
  }
  const CudaDeviceInfo& info = devices->front();
  if (info.compute_capability < 80) {
    std::printf(
        "no usable CUDA device, benchmark skipped: %s has compute capability %d; the kernels are "
        "built for sm_80 and sm_90\n",
        info.name.c_str(), info.compute_capability);
    return 0;
  }
  if (cudaError_t e = cudaSetDevice(info.ordinal); e != cudaSuccess) {
    std::printf("no usable CUDA device, benchmark skipped: cudaSetDevice: %s\n",
                cudaGetErrorString(e));
    return 0;
  }
  DeviceInfo device;
  device.name = info.name;
  device.compute_capability = info.compute_capability;
  device.multiprocessors = info.multiprocessors;
  device.memory_bytes = info.total_memory_bytes;
  int l2 = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, info.ordinal);
      e != cudaSuccess) {
    std::printf("cudaDeviceGetAttribute(L2): %s\n", cudaGetErrorString(e));
    return 1;
  }
  device.l2_bytes = l2;
  std::printf("device: %s (sm_%d, %d SMs, L2 %.0f MiB, %.1f GiB)%s\n", device.name.c_str(),
              device.compute_capability, device.multiprocessors, device.l2_bytes / 1048576.0,
              device.memory_bytes / 1073741824.0, options.quick ? ", --quick shapes" : "");

  int failures = 0;
  auto fail = [&](const std::string& what, const absl::Status& status) {
    std::printf("FAILED %s: %s\n", what.c_str(), status.ToString().c_str());
    ++failures;
  };
  Stream stream;
  Event start, stop;
  DeviceMem flush;
  for (absl::Status s : {stream.Create(), start.Create(), stop.Create(),
                         flush.Allocate(static_cast<size_t>(std::max<int64_t>(4 * device.l2_bytes,
                                                                              int64_t{64} << 20)),
                                        "L2 flush buffer")}) {
    if (!s.ok()) {
      fail("setup", s);
      return 1;
    }
  }
  Timer timer;
  timer.stream = stream.get();
  timer.start = start.get();
  timer.stop = stop.get();
  timer.flush = flush.get();
  timer.flush_bytes = flush.bytes();
  timer.warmup = options.quick ? 2 : 3;
  timer.samples = options.quick ? 5 : 20;
  std::printf(
      "timing: median of %d samples after %d warm-up calls; cudaEvents around each call;"
      " L2 flushed (%.0f MiB memset) before every sample, untimed\n",
      timer.samples, timer.warmup, timer.flush_bytes / 1048576.0);

  // ---- Ceilings.
  std::vector<Row> rows;
  std::optional<double> copy_rate, read_rate, gemm_rate[3];  // gemm_rate by DType value.
  const size_t sweep_bytes = options.quick ? (size_t{256} << 20) : (size_t{1} << 30);
  if (absl::StatusOr<Row> r = CopyCeiling(sweep_bytes, timer); r.ok()) {
    copy_rate = r->Rate();
    rows.push_back(*r);
  } else {
    fail("copy ceiling", r.status());
  }
  if (absl::StatusOr<Row> r = ReadCeiling(sweep_bytes, device, timer); r.ok()) {
    read_rate = r->Rate();
    rows.push_back(*r);
  } else {
    fail("read ceiling", r.status());
  }
  const int gemm_n = options.quick ? 4096 : 8192;
  absl::StatusOr<const cuda::CublasApi*> cublas = cuda::LoadCublas();
  if (!cublas.ok()) {
    fail("GEMM ceilings (cuBLAS)", cublas.status());
  } else {
    CublasHandle handle;
    if (absl::Status s = handle.Create(*cublas, stream.get()); !s.ok()) {
      fail("GEMM ceilings (cuBLAS handle)", s);
    } else {
      for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
        if (absl::StatusOr<Row> r = GemmCeiling(dtype, gemm_n, **cublas, handle.get(), timer);
            r.ok()) {
          gemm_rate[static_cast<int>(dtype)] = r->Rate();
          rows.push_back(*r);
        } else {
          fail(absl::StrCat("GEMM ceiling ", DTypeName(dtype)), r.status());
        }
      }
    }
  }
  std::printf("\nceilings (same run):\n");
  for (const Row& r : rows) {
    if (r.name == "copy_d2d") {
      std::printf(
          "  copy   cudaMemcpy D2D %d MiB        %8.3f ms  %7.3f TB/s (bytes read + written)\n",
          r.tokens, r.ms, r.Rate() / 1e12);
    } else if (r.name == "read_sweep") {
      std::printf("  read   sweep kernel %d MiB          %8.3f ms  %7.3f TB/s (bytes read)\n",
                  r.tokens, r.ms, r.Rate() / 1e12);
    } else {
      std::printf("  %-6s cuBLAS %s %d^3%s  %8.3f ms  %7.1f TFLOP/s\n", r.dtype.c_str(),
                  r.dtype == "f32" ? "Sgemm " : "GemmEx", r.tokens,
                  r.dtype == "f32" ? " (no TF32)   " : " (fp32 accum)", r.ms, r.Rate() / 1e12);
    }
  }

  // ---- Decode.
  std::printf(
      "\ndecode: RunDecodeAttention (split-KV kernel + combine); KV bytes = visible keys x"
      " KV heads x (K + V) x head_dim x element size\n");
  const char* vs_ours = "";  // The column of FlashInfer's rows, where they are built.
#if ATTNSERVE_BENCH_FLASHINFER
  std::printf(
      "  + flashinfer: FlashInfer 0.5.3's paged decode on the same pages and q (rounded to the"
      " page type), its own split-KV plan and merge; time/ours = its ms / ours\n");
  vs_ours = "time/ours";
#endif
  std::printf("%-20s %4s %5s %6s %6s %5s %9s %8s %8s %8s %8s %9s\n", "case", "kv", "batch", "ctx",
              "window", "items", "ms", "KV MiB", "TB/s", "of read", "of copy", vs_ours);
  for (const Case& c : DecodeCases(options.quick)) {
    absl::StatusOr<Row> r = RunAttentionCase(c, /*decode=*/true, device, timer);
    if (!r.ok()) {
      fail(absl::StrCat("decode ", c.shape.name, " batch ", c.batch, " ctx ", c.tokens),
           r.status());
      continue;
    }
    std::printf("%-20s %4s %5d %6d %6d %5d %9.4f %8.1f %8.3f %8s %8s\n", r->name.c_str(),
                r->dtype.c_str(), r->batch, r->tokens, r->window, r->items, r->ms,
                r->work / 1048576.0, r->Rate() / 1e12, Ratio(r->Rate(), read_rate).c_str(),
                Ratio(r->Rate(), copy_rate).c_str());
    rows.push_back(*r);
#if ATTNSERVE_BENCH_FLASHINFER
    if (c.shape.dtype == DType::kF32) continue;  // FlashInfer reads 16-bit pages only.
    absl::StatusOr<Row> fi = RunFlashInferCase(c, /*decode=*/true, device, timer);
    if (absl::IsUnimplemented(fi.status())) {
      std::printf("%-20s %s\n", "  + flashinfer", std::string(fi.status().message()).c_str());
      continue;
    }
    if (!fi.ok()) {
      fail(absl::StrCat("flashinfer decode ", c.shape.name, " batch ", c.batch, " ctx ", c.tokens),
           fi.status());
      continue;
    }
    std::printf("%-20s %4s %5d %6d %6d %5d %9.4f %8.1f %8.3f %8s %8s %8.2fx\n", "  + flashinfer",
                fi->dtype.c_str(), fi->batch, fi->tokens, fi->window, fi->items, fi->ms,
                fi->work / 1048576.0, fi->Rate() / 1e12, Ratio(fi->Rate(), read_rate).c_str(),
                Ratio(fi->Rate(), copy_rate).c_str(), r->ms > 0.0 ? fi->ms / r->ms : 0.0);
    rows.push_back(*fi);
#endif
  }

  // ---- MLA absorbed decode (DeepSeek-V3's widths; --quick: batch 8, ctx 1024).
  std::printf(
      "\nMLA decode: RunMlaDecodeAttention (kernels/cuda/mla, split-KV + combine), 128 heads,"
      " latent 512 + rope 64, bf16 pages of 64; KV bytes = visible keys x 576 x 2\n");
  {
    bench::MlaDecodeCase mla;
    if (options.quick) {
      mla.batch = 8;
      mla.tokens = 1024;
    }
    const bench::MlaMedianMsFn median_ms = [&](const std::function<absl::Status()>& launch) {
      return timer.MedianMs(launch);
    };
    for (bool flashinfer : {false, true}) {
      const char* name = flashinfer ? "  + flashinfer" : "mla128_512+64_bf16";
      absl::StatusOr<bench::MlaDecodeTiming> t = bench::TimeMlaDecode(
          mla, flashinfer, device.multiprocessors, median_ms, timer.stream);
      if (absl::IsUnimplemented(t.status())) {
        std::printf("%-20s %s\n", name, std::string(t.status().message()).c_str());
        continue;
      }
      if (!t.ok()) {
        fail(absl::StrCat("MLA decode", flashinfer ? " (flashinfer)" : ""), t.status());
        continue;
      }
      Row r;
      r.kind = flashinfer ? "flashinfer_mla_decode" : "mla_decode";
      r.name = "mla128_512+64_bf16";
      r.dtype = "bf16";
      r.heads = mla.heads;
      r.kv_heads = 1;
      r.head_dim = mla.latent + mla.rope;
      r.batch = mla.batch;
      r.tokens = mla.tokens;
      r.items = t->items;
      r.ms = t->ms;
      r.work = t->kv_bytes;
      std::printf("%-20s %4s %5d %6d %6d %5d %9.4f %8.1f %8.3f %8s %8s\n", name, "bf16", r.batch,
                  r.tokens, 0, r.items, r.ms, r.work / 1048576.0, r.Rate() / 1e12,
                  Ratio(r.Rate(), read_rate).c_str(), Ratio(r.Rate(), copy_rate).c_str());
      rows.push_back(r);
    }
  }

  // ---- Prefill.
  std::printf(
      "\nprefill: RunPrefillAttention (f16/bf16: tensor-core mma.sync; f32: CUDA cores),"
      " causal; FLOPs = 4 x head_dim x heads x visible (query, key) pairs\n");
#if ATTNSERVE_BENCH_FLASHINFER
  std::printf(
      "  + flashinfer: FlashInfer 0.5.3's paged prefill on the same pages and q (rounded to the"
      " page type), its own tile schedule (no split-KV); time/ours = its ms / ours\n");
#endif
  std::printf("%-20s %4s %5s %6s %6s %5s %9s %8s %9s %9s %9s\n", "case", "kv", "batch", "tokens",
              "window", "items", "ms", "GFLOP", "TFLOP/s", "of GEMM", vs_ours);
  for (const Case& c : PrefillCases(options.quick)) {
    absl::StatusOr<Row> r = RunAttentionCase(c, /*decode=*/false, device, timer);
    if (!r.ok()) {
      fail(absl::StrCat("prefill ", c.shape.name, " batch ", c.batch, " tokens ", c.tokens),
           r.status());
      continue;
    }
    std::printf("%-20s %4s %5d %6d %6d %5d %9.4f %8.1f %9.2f %9s\n", r->name.c_str(),
                r->dtype.c_str(), r->batch, r->tokens, r->window, r->items, r->ms, r->work / 1e9,
                r->Rate() / 1e12,
                Ratio(r->Rate(), gemm_rate[static_cast<int>(c.shape.dtype)]).c_str());
    rows.push_back(*r);
#if ATTNSERVE_BENCH_FLASHINFER
    if (c.shape.dtype == DType::kF32) continue;  // FlashInfer reads 16-bit pages only.
    absl::StatusOr<Row> fi = RunFlashInferCase(c, /*decode=*/false, device, timer);
    if (absl::IsUnimplemented(fi.status())) {
      std::printf("%-20s %s\n", "  + flashinfer", std::string(fi.status().message()).c_str());
      continue;
    }
    if (!fi.ok()) {
      fail(absl::StrCat("flashinfer prefill ", c.shape.name, " batch ", c.batch, " tokens ",
                        c.tokens),
           fi.status());
      continue;
    }
    std::printf("%-20s %4s %5d %6d %6d %5d %9.4f %8.1f %9.2f %9s %8.2fx\n", "  + flashinfer",
                fi->dtype.c_str(), fi->batch, fi->tokens, fi->window, fi->items, fi->ms,
                fi->work / 1e9, fi->Rate() / 1e12,
                Ratio(fi->Rate(), gemm_rate[static_cast<int>(c.shape.dtype)]).c_str(),
                r->ms > 0.0 ? fi->ms / r->ms : 0.0);
    rows.push_back(*fi);
#endif
  }
  std::printf(
      "\nof read / of copy: decode KV bytes per second / the read sweep's (resp. the D2D copy's,"
      " read + written) bytes per second. of GEMM: prefill attention FLOP/s / cuBLAS GEMM FLOP/s"
      " of the page dtype (bf16, f16: GemmEx, fp32 accumulation; f32: Sgemm without TF32).\n");
  if (!options.csv.empty()) WriteCsv(options.csv, rows);
  if (failures > 0) std::printf("attention_kernel_bench: %d measurement(s) failed\n", failures);
  return failures > 0 ? 1 : 0;
}

}  // namespace
}  // namespace attnserve

int main(int argc, char** argv) {
  attnserve::Options options;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      options.quick = true;
    } else if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      options.csv = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--csv PATH]\n", argv[0]);
      return 2;
    }
  }
  return attnserve::Run(options);
}

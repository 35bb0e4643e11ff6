#include "kernels/cuda/runtime/device_memory.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/runtime/cuda_status.h"

namespace attnserve::cuda {

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

absl::Status DeviceBuffer::EnsureBytes(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  // Grow by at least half again, so a slowly growing batch reallocates O(log n) times.
  const size_t wanted = std::max(bytes, bytes_ + bytes_ / 2);
  if (data_ != nullptr) {
    // The old buffer may still be read by work queued earlier: callers synchronise their stream
    // before a call returns, so nothing is in flight here.
    cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&data_, wanted),
                                 absl::StrCat("workspace of ", wanted, " bytes"));
  bytes_ = wanted;
  return absl::OkStatus();
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

absl::Status PinnedBuffer::EnsureBytes(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  const size_t wanted = std::max(bytes, bytes_ + bytes_ / 2);
  if (data_ != nullptr) {
    cudaFreeHost(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data = nullptr;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data, wanted),
                                 absl::StrCat("pinned staging of ", wanted, " bytes"));
  data_ = static_cast<std::byte*>(data);
  bytes_ = wanted;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceSlabPool>> DeviceSlabPool::Create(int64_t bytes,
                                                                       int64_t slab_bytes,
                                                                       bool poison) {
  if (slab_bytes <= 0 || bytes < slab_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("device KV pool of ", bytes,
                                                   " bytes: must hold at least one slab of ",
                                                   slab_bytes, " bytes"));
  }
  const int64_t num_slabs = bytes / slab_bytes;
  void* base = nullptr;
  ATTNSERVE_CUDA_RETURN_IF_ERROR(
      cudaMalloc(&base, static_cast<size_t>(num_slabs * slab_bytes)),
      absl::StrCat("device KV pool of ", num_slabs * slab_bytes, " bytes"));
  if (poison) {
    if (cudaError_t e = cudaMemset(base, 0xFF, static_cast<size_t>(num_slabs * slab_bytes));
        e != cudaSuccess) {
      cudaFree(base);
      return CudaStatus(e, "poisoning the device KV pool");
    }
  }
  return std::unique_ptr<DeviceSlabPool>(new DeviceSlabPool(base, slab_bytes, num_slabs, poison));
}

DeviceSlabPool::DeviceSlabPool(void* base, int64_t slab_bytes, int64_t num_slabs, bool poison)
    : base_(base), slab_bytes_(slab_bytes), num_slabs_(num_slabs), poison_(poison) {
  free_.reserve(static_cast<size_t>(num_slabs));
  for (int64_t i = num_slabs - 1; i >= 0; --i) free_.push_back(i * slab_bytes);
}

DeviceSlabPool::~DeviceSlabPool() { cudaFree(base_); }

absl::StatusOr<int64_t> DeviceSlabPool::Acquire() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("device KV pool exhausted: all ", num_slabs_,
                                                     " slabs of ", slab_bytes_,
                                                     " bytes are held by layers"));
  }
  const int64_t offset = free_.back();
  free_.pop_back();
  return offset;
}

void DeviceSlabPool::Release(int64_t offset) {
  absl::MutexLock lock(&mu_);
  free_.push_back(offset);
}

DevicePageStore::DevicePageStore(std::shared_ptr<DeviceSlabPool> pool, int64_t page_bytes)
    : pool_(std::move(pool)),
      page_bytes_(page_bytes),
      pages_per_slab_(pool_->slab_bytes() / page_bytes) {}

DevicePageStore::~DevicePageStore() {
  for (int64_t offset : slabs_) {
    if (offset >= 0) pool_->Release(offset);
  }
}

absl::Status DevicePageStore::Commit(absl::Span<const int32_t> pages) {
  for (int32_t page : pages) {
    const size_t slab = static_cast<size_t>(page / pages_per_slab_);
    if (slab >= slabs_.size()) slabs_.resize(slab + 1, -1);
    if (slabs_[slab] >= 0) continue;
    absl::StatusOr<int64_t> offset = pool_->Acquire();
    if (!offset.ok()) return offset.status();
    slabs_[slab] = *offset;
  }
  return absl::OkStatus();
}

absl::Status DevicePageStore::CopyPage(int32_t from, absl::Span<const int32_t> to,
                                      cudaStream_t stream) const {
  for (int32_t page : to) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(PagePtr(page), PagePtr(from), static_cast<size_t>(page_bytes_),
                        cudaMemcpyDeviceToDevice, stream),
        "copying a KV page");
  }
  return absl::OkStatus();
}

absl::Status DevicePageStore::Download(absl::Span<const int32_t> pages, void* host,
                                       cudaStream_t stream) const {
  auto* out = static_cast<std::byte*>(host);
  for (size_t i = 0; i < pages.size(); ++i) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out + i * page_bytes_, PagePtr(pages[i]), static_cast<size_t>(page_bytes_),
                        cudaMemcpyDeviceToHost, stream),
        "downloading a KV page");
  }
  return absl::OkStatus();
}

absl::Status DevicePageStore::Upload(absl::Span<const int32_t> pages, const void* host,
                                     cudaStream_t stream) const {
  const auto* in = static_cast<const std::byte*>(host);
  for (size_t i = 0; i < pages.size(); ++i) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(PagePtr(pages[i]), in + i * page_bytes_, static_cast<size_t>(page_bytes_),
                        cudaMemcpyHostToDevice, stream),
        "uploading a KV page");
  }
  return absl::OkStatus();
}

}  // namespace attnserve::cuda

// Device and pinned host memory owned by RAII types, and the device page pool: one cudaMalloc
// made when the backend starts, handed to layers in fixed-size slabs, so no layer ever calls
// cudaMalloc on the hot path for its KV pages.
#ifndef ATTNSERVE_KERNELS_CUDA_RUNTIME_DEVICE_MEMORY_H_
#define ATTNSERVE_KERNELS_CUDA_RUNTIME_DEVICE_MEMORY_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace attnserve::cuda {

// A grow-only device buffer (workspace): EnsureBytes reallocates only when a call needs more than
// any call before it, so steady-state calls allocate nothing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  absl::Status EnsureBytes(size_t bytes);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// The same for page-locked host memory (staging for async copies).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();
  absl::Status EnsureBytes(size_t bytes);
  std::byte* data() const { return data_; }

 private:
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
};

// One device allocation split into slabs of slab_bytes. Thread-safe.
class DeviceSlabPool {
 public:
  // Allocates `bytes` (rounded down to whole slabs, at least one) once. `poison` fills it with
  // 0xFF bytes: NaN in f32, f16 and bf16, so a kernel reading a slot nothing wrote shows up.
  static absl::StatusOr<std::unique_ptr<DeviceSlabPool>> Create(int64_t bytes, int64_t slab_bytes,
                                                                bool poison);
  ~DeviceSlabPool();

  // Byte offset of a free slab from base(). RESOURCE_EXHAUSTED when none is left.
  absl::StatusOr<int64_t> Acquire();
  void Release(int64_t offset);

  void* base() const { return base_; }
  int64_t slab_bytes() const { return slab_bytes_; }
  int64_t capacity_bytes() const { return num_slabs_ * slab_bytes_; }
  bool poison() const { return poison_; }

 private:
  DeviceSlabPool(void* base, int64_t slab_bytes, int64_t num_slabs, bool poison);
  void* const base_;
  const int64_t slab_bytes_;
  const int64_t num_slabs_;
  const bool poison_;
  absl::Mutex mu_;
  std::vector<int64_t> free_ ABSL_GUARDED_BY(mu_);  // Slab offsets; back() is handed out next.
};

// A layer's view of the pool: page id -> byte offset. Slabs are taken as page ids are first used
// (as HostPageStore commits host slabs) and returned when the layer is destroyed.
class DevicePageStore {
 public:
  // page_bytes <= pool->slab_bytes() (checked by the backend when the layer is created).
  DevicePageStore(std::shared_ptr<DeviceSlabPool> pool, int64_t page_bytes);
  ~DevicePageStore();

  // Makes sure every page has a slab. RESOURCE_EXHAUSTED when the device pool is out of slabs.
  absl::Status Commit(absl::Span<const int32_t> pages);
  // Byte offset of a committed page from the pool base.
  int64_t PageOffset(int32_t page) const {
    return slabs_[page / pages_per_slab_] + (page % pages_per_slab_) * page_bytes_;
  }
  int64_t page_bytes() const { return page_bytes_; }
  void* pool_base() const { return pool_->base(); }

  // Whole-page copies queued on `stream` (committed pages; the caller synchronises). A fork's
  // partial last page, device to device:
  absl::Status CopyPage(int32_t from, absl::Span<const int32_t> to, cudaStream_t stream) const;
  // Export and import, page_bytes per page in `pages`' order: device to host and host to device.
  absl::Status Download(absl::Span<const int32_t> pages, void* host, cudaStream_t stream) const;
  absl::Status Upload(absl::Span<const int32_t> pages, const void* host,
                      cudaStream_t stream) const;

 private:
  std::byte* PagePtr(int32_t page) const {
    return static_cast<std::byte*>(pool_->base()) + PageOffset(page);
  }

  std::shared_ptr<DeviceSlabPool> pool_;
  int64_t page_bytes_;
  int64_t pages_per_slab_;
  std::vector<int64_t> slabs_;  // Slab offset per slab index, -1 = not committed.
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_RUNTIME_DEVICE_MEMORY_H_

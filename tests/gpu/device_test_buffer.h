// What the FlashInfer adapter tests (flashinfer_{decode,prefill}_test.cc) share on the real device:
// whether one is there, and a device copy of host bytes that fails the running test when the
// copy does. Header-only: both tests link the CUDA runtime, nothing of ours.
#ifndef ATTNSERVE_TESTS_GPU_DEVICE_TEST_BUFFER_H_
#define ATTNSERVE_TESTS_GPU_DEVICE_TEST_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gtest/gtest.h"

namespace attnserve::cuda {

inline bool HaveDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Device copy of host bytes (or uninitialised device memory when `host` is null), freed with the
// object.
class DeviceBuffer {
 public:
  DeviceBuffer(const void* host, size_t bytes) {
    EXPECT_EQ(cudaMalloc(&data_, bytes == 0 ? 1 : bytes), cudaSuccess);
    if (host != nullptr && bytes > 0) {
      EXPECT_EQ(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }
  const int32_t* ints() const { return static_cast<const int32_t*>(data_); }

 private:
  void* data_ = nullptr;
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_TESTS_GPU_DEVICE_TEST_BUFFER_H_

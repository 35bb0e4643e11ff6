// The CUDA runtime entry points the CUDA backend's host code calls, implemented on the CPU for the
// emulated device (tests/gpu/emulated/CMakeLists.txt, docs/design.md): "device" memory is host
// memory, every stream is the host thread (async copies and launches complete before they return,
// in issue order), and the one device is described as the emulator it is. Linked instead of
// cudart, never alongside it.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

namespace {

cudaError_t last_error = cudaSuccess;
// Fault injection (tests): the fail_countdown-th cudaMemcpyAsync from arming returns fail_error.
int fail_countdown = 0;
cudaError_t fail_error = cudaSuccess;

cudaError_t Record(cudaError_t error) {
  if (error != cudaSuccess) last_error = error;
  return error;
}

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return Record(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::strncpy(prop->name, "CPU block emulator (not a GPU)", sizeof(prop->name) - 1);
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 4;
  prop->totalGlobalMem = size_t{8} << 30;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : Record(cudaErrorInvalidDevice);
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = size_t{4} << 30;
  *total_bytes = size_t{8} << 30;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  *ptr = std::aligned_alloc(256, (size + 255) / 256 * 256);
  return *ptr != nullptr ? cudaSuccess : Record(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaMalloc(ptr, size); }
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int /*flags*/) {
  return cudaMalloc(ptr, size);
}
cudaError_t cudaFreeHost(void* ptr) { return cudaFree(ptr); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind /*kind*/) {
  if (count > 0) std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t /*stream*/) {
  if (fail_countdown > 0 && --fail_countdown == 0) return Record(fail_error);
  return cudaMemcpy(dst, src, count, kind);
}

// Test hook, declared by the tests that use it: the nth cudaMemcpyAsync from now (1 = the next)
// fails with `error` (and, as in the real runtime, leaves it for cudaGetLastError).
void AttnserveFakeCudaFailMemcpyAsync(int nth, cudaError_t error) {
  fail_countdown = nth;
  fail_error = error;
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  std::memset(ptr, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t /*stream*/) {
  return cudaMemset(ptr, value, count);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int /*flags*/) {
  static int token;  // Any non-null handle: streams are the calling thread.
  *stream = reinterpret_cast<cudaStream_t>(&token);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t /*stream*/) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t /*stream*/) { return cudaSuccess; }

// Events: the host clock at record time (streams are synchronous here), for the layer's stage
// timer (kernels/cuda/layer/stage_timer.h).
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new std::chrono::steady_clock::time_point());
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<std::chrono::steady_clock::time_point*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t /*stream*/) {
  *reinterpret_cast<std::chrono::steady_clock::time_point*>(event) =
      std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(
            *reinterpret_cast<std::chrono::steady_clock::time_point*>(end) -
            *reinterpret_cast<std::chrono::steady_clock::time_point*>(start))
            .count();
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t error = last_error;
  last_error = cudaSuccess;
  return error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) { return cudaGetErrorName(error); }

}  // extern "C"

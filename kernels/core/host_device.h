// ATTNSERVE_HD marks a function that host code and CUDA kernels both call: __host__ __device__
// under nvcc, nothing under a plain C++ compiler. Headers that use it include nothing else that
// nvcc cannot read (no absl), so the CPU and CUDA backends can share them.
#ifndef ATTNSERVE_KERNELS_CORE_HOST_DEVICE_H_
#define ATTNSERVE_KERNELS_CORE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define ATTNSERVE_HD __host__ __device__
#else
#define ATTNSERVE_HD
#endif

#endif  // ATTNSERVE_KERNELS_CORE_HOST_DEVICE_H_

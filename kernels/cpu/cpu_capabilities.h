// What the CPU backend serves (kernels/capabilities.h): every variant, variation and operation the
// engine has, at any head dim.
#ifndef ATTNSERVE_KERNELS_CPU_CPU_CAPABILITIES_H_
#define ATTNSERVE_KERNELS_CPU_CPU_CAPABILITIES_H_

#include "kernels/capabilities.h"

namespace attnserve {

const BackendCapabilities& CpuCapabilities();

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_CPU_CAPABILITIES_H_

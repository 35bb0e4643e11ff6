// What the CUDA backend serves (kernels/capabilities.h): MHA/MQA/GQA at head dims 64 and 128 with
// f32, f16 or bf16 pages, the kernels' instantiations (kernels/cuda/attention/dispatch.h). Plain
// data compiled into attnserve_core, not the CUDA module, so that CPU-only builds, the server and
// the README check (client/tools/capabilities_main.cc) read it without a GPU or the module.
#ifndef ATTNSERVE_KERNELS_CUDA_CUDA_CAPABILITIES_H_
#define ATTNSERVE_KERNELS_CUDA_CUDA_CAPABILITIES_H_

#include "kernels/capabilities.h"

namespace attnserve {

const BackendCapabilities& CudaCapabilities();

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CUDA_CUDA_CAPABILITIES_H_

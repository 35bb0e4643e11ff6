// How short a decode KV split may be, shared by the CPU decode (kernels/cpu/decode_attention.cc)
// and the CUDA planner (kernels/cuda/attention/batch_plan.h), so both backends cut a long context
// the same way: flash-decoding splits one sequence's keys across workers and merges their partial
// softmax states, and a split shorter than this costs more in its merge than it saves.
#ifndef ATTNSERVE_KERNELS_SPEC_DECODE_SPLITS_H_
#define ATTNSERVE_KERNELS_SPEC_DECODE_SPLITS_H_

#include <cstdint>

namespace attnserve {

// Keys; splits are added only while each keeps at least this many.
inline constexpr int64_t kDecodeMinKeysPerSplit = 256;

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_SPEC_DECODE_SPLITS_H_

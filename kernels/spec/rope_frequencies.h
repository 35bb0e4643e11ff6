// The RoPE inverse frequencies and cos/sin factor of a layer, rope scaling included.
//
// One computation for every backend (the CPU layers and the CUDA RoPE kernels rotate by the same
// numbers, through RotaryPositions in attention_variation.h), following transformers'
// modeling_rope_utils.py function by function so that a checkpoint's positions rotate here exactly
// as there. Computed in double; transformers computes in float32, a relative difference of ~1e-7
// per frequency.
#ifndef ATTNSERVE_KERNELS_SPEC_ROPE_FREQUENCIES_H_
#define ATTNSERVE_KERNELS_SPEC_ROPE_FREQUENCIES_H_

#include <vector>

#include "kernels/spec/layer_spec.h"

namespace attnserve {

// One inverse frequency per rotated pair, RotaryDim(spec) / 2 of them (empty without RoPE): pair i
// at position p rotates by p * result[i] radians. `spec` must pass ValidateLayerSpec.
std::vector<double> RopeInverseFrequencies(const LayerSpec& spec);

// The factor cos and sin are multiplied by (transformers' `attention_scaling`): 1 except for YaRN.
double RopeAttentionFactor(const LayerSpec& spec);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_SPEC_ROPE_FREQUENCIES_H_

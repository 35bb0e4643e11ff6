// The small fixed layer specs that the request fuzzers validate against: one of each variant
// family (MHA with RoPE, GQA with biases and a sliding window, MLA with a query LoRA), every size
// tiny so that any tensor a fuzz input can describe stays small.
//
// Request validation (server/rpc/step_codec.h) and checkpoint loading
// (kernels/model/checkpoint_loader.h) take a session's spec as given; the spec itself is fuzzed by
// spec_codec_fuzzer and configure_request_fuzzer.
#ifndef ATTNSERVE_TESTS_FUZZ_FUZZ_SPECS_H_
#define ATTNSERVE_TESTS_FUZZ_FUZZ_SPECS_H_

#include <cstdlib>
#include <vector>

#include "kernels/spec/layer_spec.h"

namespace attnserve::fuzz {

inline std::vector<LayerSpec> MakeFuzzSpecs() {
  LayerSpec mha;
  mha.variant = AttentionVariant::kMHA;
  mha.d_model = 8;
  mha.num_heads = 2;
  mha.num_kv_heads = 2;
  mha.head_dim = 4;
  mha.rope = RopeLayout::kHalf;

  LayerSpec gqa;
  gqa.variant = AttentionVariant::kGQA;
  gqa.d_model = 16;
  gqa.num_heads = 4;
  gqa.num_kv_heads = 2;
  gqa.head_dim = 4;
  gqa.qkv_bias = true;
  gqa.o_bias = true;
  gqa.sliding_window = 4;

  LayerSpec mla;
  mla.variant = AttentionVariant::kMLA;
  mla.d_model = 16;
  mla.num_heads = 2;
  mla.rope = RopeLayout::kInterleaved;
  mla.mla.q_lora_rank = 8;
  mla.mla.kv_lora_rank = 8;
  mla.mla.qk_nope_head_dim = 4;
  mla.mla.qk_rope_head_dim = 2;
  mla.mla.v_head_dim = 4;

  std::vector<LayerSpec> specs = {mha, gqa, mla};
  // A spec the engine would refuse would make every request fuzzer test nothing.
  for (const LayerSpec& spec : specs) {
    if (!ValidateLayerSpec(spec).ok()) std::abort();
  }
  return specs;
}

// The specs, built once per process (a fuzzer runs millions of inputs).
inline const std::vector<LayerSpec>& FuzzSpecs() {
  static const std::vector<LayerSpec>* const specs = new std::vector<LayerSpec>(MakeFuzzSpecs());
  return *specs;
}

}  // namespace attnserve::fuzz

#endif  // ATTNSERVE_TESTS_FUZZ_FUZZ_SPECS_H_

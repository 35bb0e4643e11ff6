// What a backend serves, declared as one plain table per backend (kernels/cpu/cpu_capabilities.h,
// kernels/cuda/cuda_capabilities.h), and the one check that refuses what a table leaves out.
//
// Why a table: the refusals used to be spread over the backends' CreateLayer and the interface's
// defaults, so neither a client (GetServerInfo) nor the README could say what a backend serves
// without reading its code. Now CreateLayer, the server's Fork/Export/Import handlers and the
// stack builder ask CheckCapabilities / CheckOperation, and everything else reads the table.
//
// A refusal names the spec or config field, the value asked for and the backend's real limit, with
// the same gRPC code each refusal had before the table: UNIMPLEMENTED for a variant, an 8-bit KV
// format or an operation the backend has no code for; INVALID_ARGUMENT for the per-layer
// variations (head dim, q/k norm, partial rotary, soft-cap, sinks, ALiBi, RoPE scaling) and plain
// KV dtypes. When the CPU backend serves what another backend refuses, the message says so.
#ifndef ATTNSERVE_KERNELS_CAPABILITIES_H_
#define ATTNSERVE_KERNELS_CAPABILITIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/core/tensor.h"
#include "kernels/kv/cache_config.h"
#include "kernels/kv/storage_format.h"
#include "kernels/model/layer_weights.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

struct BackendCapabilities {
  std::string backend;  // "cpu" or "cuda", as AttentionBackend::name().
  std::vector<AttentionVariant> variants;
  // head_dim of MHA/MQA/GQA layers the kernels are built for; empty = any ValidateLayerSpec
  // accepts. MLA's widths are its own (MlaDims) and not limited here.
  std::vector<int> head_dims;
  // Dtypes a layer computes in (projections and attention). Informational: a layer's compute
  // dtype is its backend's choice (CUDA: from the KV format), never asked for by a spec.
  std::vector<DType> compute_dtypes;
  // KV page storage formats: plain f32/f16/bf16 elements, or 8-bit codes with per-page scales
  // (MLA's latent pages included).
  std::vector<KvStorageFormat> kv_formats;
  // RoPE scalings applied (LayerSpec::rope_scaling.type; kNone is always served).
  std::vector<RopeScalingType> rope_scalings;
  // YaRN's attention factor != 1 (cos and sin multiplied by it; mscale != mscale_all_dim).
  bool yarn_attention_factor = false;
  // The model-family variations computed, by NamedVariation::name (kernels/spec/
  // attention_variation.h: "qk_norm=rms", "partial_rotary", "logit_softcapping", "alibi",
  // "sliding_window", "non_causal", ...). A variation not listed is refused.
  std::vector<std::string> variations;
  // AttentionLayer operations.
  bool fork = false;           // ForkSequence (prefix sharing; the Fork RPC).
  bool export_import = false;  // ExportSequence / ImportSequence (moving a request, drains).
  bool stacks = false;         // Layers of this backend in a hybrid stack (kernels/stack/).
};

// Whether `capabilities` lists the variation `name` (NamedVariation::name).
bool ServesVariation(const BackendCapabilities& capabilities, absl::string_view name);

// One thing a spec or KV format asks for that a backend does not serve.
struct CapabilityGap {
  std::string field;       // The spec or config field: "variant", "head_dim", "qk_norm", ...
  std::string short_name;  // For tables: "MLA", "hd 96", "qk_norm", "soft-cap", ...
  absl::Status status;     // The refusal CheckCapabilities returns for it.
};

// Every gap between what `spec` and `kv_format` ask for and what `capabilities` serve, in a fixed
// order (variant, head dim, layer variations, RoPE scaling, KV format); empty when served.
std::vector<CapabilityGap> FindCapabilityGaps(const BackendCapabilities& capabilities,
                                              const LayerSpec& spec,
                                              const KvStorageFormat& kv_format);

// OK, or the first gap's refusal. `spec` must already be valid (ValidateLayerSpec).
absl::Status CheckCapabilities(const BackendCapabilities& capabilities, const LayerSpec& spec,
                               const KvCacheConfig& kv_config);

enum class LayerOperation : uint8_t {
  kFork,          // BackendCapabilities::fork
  kExportImport,  // BackendCapabilities::export_import
  kStack,         // BackendCapabilities::stacks
};

// OK when `capabilities` serve `operation`, else UNIMPLEMENTED naming it and the backend.
absl::Status CheckOperation(const BackendCapabilities& capabilities, LayerOperation operation);

// What every backend's CreateLayer checks before it builds anything, in this order: the spec and
// the weights are valid, the backend serves them (CheckCapabilities), and the KV paging is valid
// once the spec's default page size fills a page_size of 0. Returns the KV configuration to build.
absl::StatusOr<KvCacheConfig> CheckLayerRequest(const BackendCapabilities& capabilities,
                                                const LayerSpec& spec, const LayerWeights& weights,
                                                const KvCacheConfig& kv_config);

// The UNIMPLEMENTED answer of an AttentionLayer that does not override `operation` (the
// interface's defaults): the server refuses earlier, through CheckOperation, naming the backend.
absl::Status UnservedOperation(LayerOperation operation);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CAPABILITIES_H_

// A hybrid stack: N attention layers, each built by a backend with its own spec and weights, run
// as one AttentionLayer on the residual stream, h <- h + attention_i(h) for i = 0 .. N-1 (no norms
// or MLPs: attnserve hosts attention layers only). Gemma 2/3 (5 sliding-window : 1 global),
// Mistral/Qwen2 with per-layer windows, or any list of layers of one d_model.
//
// KV accounting. Each layer keeps its own paged pool (a sliding-window layer holds at most its
// window's pages), built WITHOUT a budget: the stack charges the shared KvMemoryBudget itself.
// Before a Prefill or Decode it charges the pages every layer will allocate for the batch (exact:
// a layer allocates before it evicts), so a batch the budget or a layer's pool cannot hold is
// refused with RESOURCE_EXHAUSTED before any layer changes; afterwards it hands back what the
// window layers evicted. Between calls the stack's charge equals the pages its layers hold.
//
// Atomicity. Inputs are the same for every layer (shapes, sequences, positions), so layer 0
// refuses bad input before anything changes, and with the pages charged up front no later layer
// can run out of them. Any other failure of a layer k > 0 (after layers < k appended the batch's
// tokens) cannot be undone (pages are append-only): the stack then releases the batch's sequences
// in every layer, remembers them as dropped (later calls on them are NOT_FOUND saying why;
// releasing one is OK), and returns the layer's error code with a message saying so.
//
// Per-layer (model) mode, StackMode::kPerLayer: the layers are not chained. PrefillLayer and
// DecodeLayer run one layer k and return its attention output, so the caller runs whatever sits
// between layers (norms, MLPs). A sequence's step is its calls on layers 0, 1, ..., n-1 in order
// with the same rows: layer 0 starts it and charges the pages every layer will allocate for it
// (held as a reservation per layer until that layer runs), so a step the budget or a pool cannot
// hold is RESOURCE_EXHAUSTED at layer 0 with nothing changed. A call out of order is
// FAILED_PRECONDITION naming the sequence and layers, nothing changed. A failure of layer k > 0
// drops the batch's sequences as in residual mode. Prefill and Decode (all layers) are refused.
//
// Moving a sequence (ExportSequence / ImportSequence): the export holds every layer's held pages
// in layer order with one LayerExtent each (SequenceExport::layers). A sequence mid-step is
// refused FAILED_PRECONDITION naming the layer that runs next. An import checks every layer (its
// extent, its pool) and charges the budget once for all of them (less the sequence's reservation,
// ReserveImport) before any layer imports; a layer that still refuses undoes the layers before
// it, so an import is all or nothing.
// Threading: as AttentionLayer; kv_usage() may be read from any thread.
#ifndef ATTNSERVE_KERNELS_STACK_LAYER_STACK_H_
#define ATTNSERVE_KERNELS_STACK_LAYER_STACK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace attnserve {

// Deepest stack accepted (Gemma 3 27B has 62 layers; a whole model's attention fits).
inline constexpr int kMaxStackLayers = 128;

// What a layer is for KV accounting: "mla", "sliding_window:<W>" (causal with a window) or
// "global".
std::string LayerKind(const LayerSpec& spec);

// KV pages held by the layers of one kind.
struct LayerKindKv {
  std::string kind;
  int layers = 0;
  int64_t kv_bytes = 0;
};

// The stack's KV bytes by layer kind, refreshed after every call that changes them; readable from
// any thread, and alive after the stack (it then reads zero bytes).
class StackKvUsage {
 public:
  std::vector<LayerKindKv> Get() const {
    absl::MutexLock lock(&mu_);
    return kinds_;
  }
  void Set(std::vector<LayerKindKv> kinds) {
    absl::MutexLock lock(&mu_);
    kinds_ = std::move(kinds);
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<LayerKindKv> kinds_ ABSL_GUARDED_BY(mu_);
};

// How a stack's layers are called: all in one call on the residual stream, or one per call.
enum class StackMode { kResidual, kPerLayer };

class LayerStack final : public AttentionLayer {
 public:
  // Builds layer i with backend.CreateLayer(specs[i], weights[i], kv_config) less its budget,
  // which the stack charges (see above). INVALID_ARGUMENT, naming "stack.layers[i]...", for no
  // layers, more than kMaxStackLayers, sizes that differ, a d_model, page size or page bytes unlike
  // layer 0's; each layer's own CreateLayer errors prefixed with "stack.layers[i]: ".
  static absl::StatusOr<std::unique_ptr<LayerStack>> Create(AttentionBackend& backend,
                                                            absl::Span<const LayerSpec> specs,
                                                            absl::Span<const LayerWeights> weights,
                                                            const KvCacheConfig& kv_config,
                                                            StackMode mode = StackMode::kResidual);
  ~LayerStack() override;

  StackMode mode() const { return mode_; }

  int num_layers() const { return static_cast<int>(layers_.size()); }
  const AttentionLayer& layer(int i) const { return *layers_[static_cast<size_t>(i)]; }
  // KV bytes by kind, shared with whoever reports them (the server's GetSession and metrics).
  const std::shared_ptr<StackKvUsage>& kv_usage() const { return kv_usage_; }

  // Layer 0's spec, causal only when every layer is (a prefill may be chunked only then).
  const LayerSpec& spec() const override { return spec_; }
  // Layer 0's config with the shared budget the stack charges.
  const KvCacheConfig& kv_config() const override { return kv_config_; }

  SequenceId CreateSequence() override;
  absl::Status ReleaseSequence(SequenceId sequence) override;
  absl::StatusOr<int64_t> SequenceLength(SequenceId sequence) const override;
  absl::StatusOr<std::vector<SequenceId>> ForkSequence(SequenceId source, int count) override;
  absl::StatusOr<SequenceExport> ExportSequence(SequenceId sequence) const override;
  absl::Status ImportSequenceInto(const SequenceExport& exported, SequenceId into) override;

  // Per-layer mode only (else FAILED_PRECONDITION): layer `layer` alone, as one step of the
  // sequences (see the header). INVALID_ARGUMENT for a layer outside [0, num_layers()).
  absl::StatusOr<Tensor> PrefillLayer(int layer, absl::Span<const PrefillChunk> chunks,
                                      const Tensor& hidden, absl::Span<const int64_t> positions);
  absl::StatusOr<Tensor> DecodeLayer(int layer, absl::Span<const SequenceId> sequences,
                                     const Tensor& hidden, absl::Span<const int64_t> positions);
  // Per-layer mode: the layer `sequence`'s step in flight runs next; 0 when none is in flight
  // (or the sequence is unknown).
  int NextLayer(SequenceId sequence) const;

  // Sums over the layers (one page size and page bytes for all).
  KvPoolUsage PoolUsage() const override;
  absl::StatusOr<int64_t> SequenceKvBytes(SequenceId sequence) const override;
  int64_t KvBytesAtLength(int64_t num_tokens) const override;
  int64_t ParameterBytes() const override;

 protected:
  // Residual mode only (AttentionLayer::Prefill/Decode checked the inputs): every layer in turn.
  absl::StatusOr<Tensor> PrefillChecked(absl::Span<const PrefillChunk> chunks,
                                        const Tensor& hidden,
                                        absl::Span<const int64_t> positions) override;
  absl::StatusOr<Tensor> DecodeChecked(absl::Span<const SequenceId> sequences,
                                       const Tensor& hidden,
                                       absl::Span<const int64_t> positions) override;
  // The stack's own reservation (its layers hold no budget): charged to the stack's budget, kept
  // per sequence, drawn on by the batch charge of the sequence's later calls and by its import.
  absl::Status ReserveKvFor(absl::Span<const SequenceId> sequences,
                            absl::Span<const int64_t> num_tokens, absl::string_view what) override;

 private:
  // A sequence's step in flight (per-layer mode): the layer it runs next, its rows, and the pages
  // still reserved for each layer that has not run it yet.
  struct Step {
    int next_layer = 0;
    int64_t rows = 0;
    std::vector<int64_t> reserved_pages;  // Per layer.
  };

  LayerStack(std::vector<std::unique_ptr<AttentionLayer>> layers, KvCacheConfig kv_config,
             StackMode mode);

  // The layers' ids of stack sequence `sequence`; NOT_FOUND (saying why, if it was dropped).
  absl::StatusOr<const std::vector<SequenceId>*> Find(SequenceId sequence) const;
  // Runs one batch through every layer: `calls(k, h)` runs layer k on the residual stream `h`.
  // `rows[i]` tokens go to stack sequence `ids[i]`.
  template <typename Call>
  absl::StatusOr<Tensor> Run(absl::Span<const SequenceId> ids, absl::Span<const int64_t> rows,
                             const Tensor& hidden, const Call& call);
  // Per-layer mode: runs layer `layer` alone for `ids` (rows[i] each), checking the step order;
  // `call(layer, layer_ids, hidden)` runs it.
  template <typename Call>
  absl::StatusOr<Tensor> RunLayer(int layer, absl::Span<const SequenceId> ids,
                                  absl::Span<const int64_t> rows, const Tensor& hidden,
                                  const Call& call);
  // The pages each layer will allocate for `rows[i]` more tokens of `found[i]`: per layer, in all.
  std::vector<int64_t> PagesNeeded(absl::Span<const std::vector<SequenceId>* const> found,
                                   absl::Span<const int64_t> rows, size_t first_layer) const;
  // Forgets the step in flight of `sequence` (if any) and its reserved pages.
  void EndStep(SequenceId sequence);
  // Forgets `sequence`'s reservation (ReserveKv); Settle then gives its bytes back.
  void DropAhead(SequenceId sequence);
  // Layer `layer` > 0 of a batch (`unit`: "batch" or "step") failed with `failure` after the
  // layers before it appended the tokens, which cannot be undone: drops `ids`, settles the budget
  // and returns `failure`'s code with a message naming `what` `layer` and saying so.
  absl::Status FailAfterAppend(absl::string_view what, int layer, absl::string_view unit,
                               absl::Span<const SequenceId> ids, const absl::Status& failure);
  // Releases `ids` in every layer and marks them dropped with `reason`.
  void Drop(absl::Span<const SequenceId> ids, const std::string& reason);
  // Hands the budget back what the layers no longer hold, and refreshes kv_usage_.
  void Settle();
  // Pages held by the layers, plus those reserved for steps in flight and by ReserveKv.
  int64_t UsedBytes() const;

  std::vector<std::unique_ptr<AttentionLayer>> layers_;
  StackMode mode_;
  LayerSpec spec_;
  KvCacheConfig kv_config_;
  std::shared_ptr<StackKvUsage> kv_usage_ = std::make_shared<StackKvUsage>();
  std::vector<LayerKindKv> kinds_;  // Kinds in order of first appearance, bytes unused.
  std::vector<size_t> kind_of_;     // Per layer: its index in kinds_.
  // Bytes charged to kv_config_.budget; equals UsedBytes() between calls.
  int64_t charged_ = 0;
  absl::flat_hash_map<SequenceId, std::vector<SequenceId>> sequences_;  // Per layer, in order.
  absl::flat_hash_map<SequenceId, std::string> dropped_;                // Why each was dropped.
  absl::flat_hash_map<SequenceId, Step> steps_;  // Per-layer mode: steps in flight.
  std::vector<int64_t> reserved_pages_;          // Per layer: the sum over steps_.
  KvReservations ahead_;  // ReserveKv's bytes by sequence, charged (in charged_).
  SequenceId next_id_ = 1;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_STACK_LAYER_STACK_H_

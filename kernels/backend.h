// The compute interface shared by the CPU and CUDA backends.
//
// A backend creates layers. A layer owns its weights and a paged KV pool, and holds any number of
// sequences (requests), each with its own page table. Prefill appends a chunk of tokens to each of
// a batch of sequences and returns their attention outputs; Decode appends exactly one token to
// each of a batch of sequences. Every failure is an absl::Status: nothing below throws or aborts.
//
// Threading: a layer's methods may be called from any thread, but not concurrently on the same
// layer (the server's scheduler serialises calls per layer); backends parallelise inside a call.
#ifndef ATTNSERVE_KERNELS_BACKEND_H_
#define ATTNSERVE_KERNELS_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/capabilities.h"
#include "kernels/core/tensor.h"
#include "kernels/kv/cache_config.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/model/layer_weights.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

class AttentionLayer {
 public:
  virtual ~AttentionLayer() = default;

  virtual const LayerSpec& spec() const = 0;
  virtual const KvCacheConfig& kv_config() const = 0;

  // Creates an empty sequence (no pages held yet).
  virtual SequenceId CreateSequence() = 0;
  // Frees the sequence's pages. NOT_FOUND for an unknown id.
  virtual absl::Status ReleaseSequence(SequenceId sequence) = 0;
  // Tokens cached so far. NOT_FOUND for an unknown id.
  virtual absl::StatusOr<int64_t> SequenceLength(SequenceId sequence) const = 0;
  // Prefix sharing: `count` new sequences that hold `source`'s cached tokens without copying them.
  // Every full page of `source` is shared, reference-counted (pages are append-only, so a shared
  // page is never written again); its last page, when partly filled, is the one a later token
  // writes into, so each fork gets its own copy of it. Later tokens of any of them never change
  // what the others see. The pool counts a shared page once; SequenceKvBytes counts it for every
  // sequence holding it. All or nothing: NOT_FOUND for an unknown source, INVALID_ARGUMENT for
  // count < 1, RESOURCE_EXHAUSTED when the copies of the partial page do not fit. Backends without
  // it (BackendCapabilities::fork false) keep this default: UNIMPLEMENTED.
  virtual absl::StatusOr<std::vector<SequenceId>> ForkSequence(SequenceId source, int count) {
    (void)source;
    (void)count;
    return UnservedOperation(LayerOperation::kFork);
  }
  // Moving a request: a copy of `sequence`'s held pages, byte for byte, with its length and the
  // index of its first held page. NOT_FOUND for an unknown id. The sequence is unchanged.
  // Backends without it (BackendCapabilities::export_import false) keep this default.
  virtual absl::StatusOr<SequenceExport> ExportSequence(SequenceId sequence) const {
    (void)sequence;
    return UnservedOperation(LayerOperation::kExportImport);
  }
  // A new sequence holding `exported`'s tokens, which must come from a layer of the same spec, KV
  // storage format and page size. INVALID_ARGUMENT when page_bytes, the byte count or
  // first_held_page do not fit this layer (a window evicts at most the pages no query can see);
  // RESOURCE_EXHAUSTED when the pool cannot hold the pages. All or nothing.
  virtual absl::StatusOr<SequenceId> ImportSequence(const SequenceExport& exported) {
    (void)exported;
    return UnservedOperation(LayerOperation::kExportImport);
  }

  // Appends `chunks[i].num_tokens` tokens to each sequence and attends each new token to its
  // sequence's cached tokens and to the new tokens before it (causal) or all of them (non-causal;
  // non-causal attention sees the whole sequence cached so far, including this chunk).
  //   hidden:    [sum(num_tokens), d_model], chunks' rows concatenated in order; f32, f16 or bf16.
  //   positions: RoPE positions, one per row; empty = each sequence continues from its length.
  //   returns    [sum(num_tokens), d_model] in hidden's dtype.
  // All-or-nothing: on error no sequence changes. RESOURCE_EXHAUSTED when the pool lacks pages.
  // Not virtual: the inputs are checked here, once for every backend (the same calls refused with
  // the same messages), before the backend's PrefillChecked.
  absl::StatusOr<Tensor> Prefill(absl::Span<const PrefillChunk> chunks, const Tensor& hidden,
                                 absl::Span<const int64_t> positions);

  // Appends one token to each of `sequences` (distinct ids) and attends it to its cache.
  //   hidden:    [sequences.size(), d_model]; f32, f16 or bf16.
  //   positions: RoPE positions, one per sequence; empty = each sequence's length.
  //   returns    [sequences.size(), d_model] in hidden's dtype.
  // Not virtual, as Prefill: checks the inputs, then runs the backend's DecodeChecked.
  absl::StatusOr<Tensor> Decode(absl::Span<const SequenceId> sequences, const Tensor& hidden,
                                absl::Span<const int64_t> positions);

  virtual KvPoolUsage PoolUsage() const = 0;

  // ---- Accounting: the layer is the one owner of what it holds ----------------------------------

  // Bytes of the KV pages `sequence` holds now (pages a sliding window evicted not counted).
  // NOT_FOUND for an unknown id.
  virtual absl::StatusOr<int64_t> SequenceKvBytes(SequenceId sequence) const = 0;
  // Bytes a sequence of `num_tokens` tokens holds between calls (whole pages, less the ones a
  // sliding window evicted).
  virtual int64_t KvBytesAtLength(int64_t num_tokens) const = 0;
  // Reserves, once, the KV bytes growing each of `sequences` by `num_tokens[i]` more tokens will
  // hold (KvBytesAtLength of the longer sequence less that of the present one), charged to the
  // layer's budget now and held by the sequence: its later Prefill/Decode pages draw on them
  // instead of charging again, so nothing else charging the same budget can take them in between
  // (a chunked Forward's later chunks cannot fail for want of them). Replaces the sequences'
  // earlier reservations; 0 tokens gives one back, as ReleaseSequence does. All or nothing:
  // NOT_FOUND for an unknown id, INVALID_ARGUMENT for a repeated one or a negative count,
  // RESOURCE_EXHAUSTED (naming the bytes, as for "this Forward") when the budget cannot hold them.
  virtual absl::Status ReserveKv(absl::Span<const SequenceId> sequences,
                                 absl::Span<const int64_t> num_tokens) = 0;
  // Bytes of the weights as the layer holds them, in its compute dtype on its device (the CPU
  // keeps fp32, or bf16 projection weights under CpuBackendOptions::projection_weights; the CUDA
  // backend keeps 16-bit projection weights for f16/bf16 layers).
  virtual int64_t ParameterBytes() const = 0;

 protected:
  // Prefill and Decode after their checks: at least one sequence (one chunk), `hidden` of
  // [rows, d_model] with exactly that many elements, `positions` empty or one non-negative entry
  // per row. Ids and counts are the backend's to check (against its sequence table).
  virtual absl::StatusOr<Tensor> PrefillChecked(absl::Span<const PrefillChunk> chunks,
                                                const Tensor& hidden,
                                                absl::Span<const int64_t> positions) = 0;
  virtual absl::StatusOr<Tensor> DecodeChecked(absl::Span<const SequenceId> sequences,
                                               const Tensor& hidden,
                                               absl::Span<const int64_t> positions) = 0;
};

// OK when every element of a call's output is finite. Otherwise INVALID_ARGUMENT: the inputs
// overflowed somewhere in the layer (finite inputs and weights can still do that), and the layer
// must roll the call back, since the same overflow has reached the K/V it appended and would
// poison every later step of those sequences.
absl::Status CheckOutputFinite(const Tensor& output);
// CheckOutputFinite's error for element `bad` (row-major) of `output`, for layers that find the
// first non-finite element elsewhere (the CUDA layer does it on the device).
absl::Status NonFiniteOutputError(const Tensor& output, int64_t bad);

// A Prefill's chunks as the sequence table reserves them (KvSequenceTable::Reserve): the ids and
// the token counts, in the chunks' order. Every backend's PrefillChecked starts here.
struct ChunkSequences {
  std::vector<SequenceId> ids;
  std::vector<int64_t> counts;
};
ChunkSequences SplitChunks(absl::Span<const PrefillChunk> chunks);

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;

  // "cpu" or "cuda".
  virtual absl::string_view name() const = 0;
  // Human-readable device description, e.g. "2 CPU threads, OpenBLAS 0.3.21".
  virtual std::string device_description() const = 0;

  // Bytes of the device memory the backend set aside for KV pages when it started (the CUDA page
  // pool), or 0 when KV pages come from host memory as they are used (CPU).
  virtual int64_t kv_device_pool_bytes() const { return 0; }

  // What this backend serves (kernels/capabilities.h): CreateLayer refuses the rest through
  // CheckCapabilities, and GetServerInfo reports it.
  virtual const BackendCapabilities& capabilities() const = 0;

  // Validates spec, weights and cache config (CheckCapabilities among them), then builds the layer.
  virtual absl::StatusOr<std::unique_ptr<AttentionLayer>> CreateLayer(
      const LayerSpec& spec, const LayerWeights& weights, const KvCacheConfig& kv_config) = 0;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_BACKEND_H_

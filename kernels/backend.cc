#include "kernels/backend.h"

#include "absl/strings/str_cat.h"

namespace attnserve {

namespace {

// OK when `hidden` is [rows, d_model] and holds exactly that many elements of its dtype.
absl::Status CheckHiddenShape(const LayerSpec& spec, const Tensor& hidden, int64_t rows) {
  if (hidden.rank() != 2 || hidden.dim(0) != rows || hidden.dim(1) != spec.d_model) {
    return absl::InvalidArgumentError(absl::StrCat("hidden has shape ", ShapeString(hidden.shape()),
                                                   ", expected [", rows, ", ", spec.d_model, "]"));
  }
  if (hidden.num_bytes() != static_cast<size_t>(rows * spec.d_model) * DTypeSize(hidden.dtype())) {
    return absl::InvalidArgumentError("hidden: byte count does not match its shape and dtype");
  }
  return absl::OkStatus();
}

// OK when `positions` is empty (continue from each sequence's length) or has one non-negative
// entry per row.
absl::Status CheckPositions(absl::Span<const int64_t> positions, int64_t rows) {
  if (positions.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(positions.size()) != rows) {
    return absl::InvalidArgumentError(absl::StrCat("positions has ", positions.size(),
                                                   " entries, expected one per token (", rows,
                                                   ") or none"));
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("positions[", i, "] = ", positions[i], ", must be >= 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tensor> AttentionLayer::Prefill(absl::Span<const PrefillChunk> chunks,
                                               const Tensor& hidden,
                                               absl::Span<const int64_t> positions) {
  if (chunks.empty()) return absl::InvalidArgumentError("prefill: no sequences given");
  int64_t rows = 0;
  for (const PrefillChunk& chunk : chunks) rows += chunk.num_tokens;
  if (absl::Status s = CheckHiddenShape(spec(), hidden, rows); !s.ok()) return s;
  if (absl::Status s = CheckPositions(positions, rows); !s.ok()) return s;
  return PrefillChecked(chunks, hidden, positions);
}

absl::StatusOr<Tensor> AttentionLayer::Decode(absl::Span<const SequenceId> sequences,
                                              const Tensor& hidden,
                                              absl::Span<const int64_t> positions) {
  if (sequences.empty()) return absl::InvalidArgumentError("decode: no sequences given");
  const int64_t rows = static_cast<int64_t>(sequences.size());
  if (absl::Status s = CheckHiddenShape(spec(), hidden, rows); !s.ok()) return s;
  if (absl::Status s = CheckPositions(positions, rows); !s.ok()) return s;
  return DecodeChecked(sequences, hidden, positions);
}

absl::StatusOr<SequenceId> AttentionLayer::ImportSequence(const SequenceExport& exported) {
  const SequenceId sequence = CreateSequence();
  if (absl::Status s = ImportSequenceInto(exported, sequence); !s.ok()) {
    ReleaseSequence(sequence).IgnoreError();
    return s;
  }
  return sequence;
}

ChunkSequences SplitChunks(absl::Span<const PrefillChunk> chunks) {
  ChunkSequences split;
  split.ids.reserve(chunks.size());
  split.counts.reserve(chunks.size());
  for (const PrefillChunk& chunk : chunks) {
    split.ids.push_back(chunk.sequence);
    split.counts.push_back(chunk.num_tokens);
  }
  return split;
}

absl::Status CheckOutputFinite(const Tensor& output) {
  const int64_t bad = FirstNonFiniteElement(output);
  if (bad < 0) return absl::OkStatus();
  return NonFiniteOutputError(output, bad);
}

absl::Status NonFiniteOutputError(const Tensor& output, int64_t bad) {
  const int64_t width = output.rank() == 2 ? output.dim(1) : 1;
  return absl::InvalidArgumentError(
      absl::StrCat("the layer's output is not finite (row ", bad / width, ", column ", bad % width,
                   " of ", ShapeString(output.shape()), ", ", DTypeName(output.dtype()),
                   "): the inputs overflow this layer; nothing was appended"));
}

}  // namespace attnserve

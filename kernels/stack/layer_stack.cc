#include "kernels/stack/layer_stack.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kernels/capabilities.h"
#include "kernels/kv/sequence_table.h"

namespace attnserve {

namespace {

absl::Status WholeStackCallError() {
  return absl::FailedPreconditionError(
      "a per-layer (model) stack runs one layer per call: name the layer (PrefillLayer, "
      "DecodeLayer)");
}

absl::Status ResidualStackCallError() {
  return absl::FailedPreconditionError(
      "a residual stack runs all its layers in one call: only per-layer (model) stacks take a "
      "layer index");
}

}  // namespace

std::string LayerKind(const LayerSpec& spec) {
  if (spec.variant == AttentionVariant::kMLA) return "mla";
  if (spec.causal && spec.sliding_window > 0) {
    return absl::StrCat("sliding_window:", spec.sliding_window);
  }
  return "global";
}

absl::StatusOr<std::unique_ptr<LayerStack>> LayerStack::Create(
    AttentionBackend& backend, absl::Span<const LayerSpec> specs,
    absl::Span<const LayerWeights> weights, const KvCacheConfig& kv_config, StackMode mode) {
  if (absl::Status s = CheckOperation(backend.capabilities(), LayerOperation::kStack); !s.ok()) {
    return s;
  }
  if (specs.empty()) {
    return absl::InvalidArgumentError("stack.layers: a stack must hold at least one layer");
  }
  if (specs.size() > static_cast<size_t>(kMaxStackLayers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stack.layers: ", specs.size(), " layers, at most ", kMaxStackLayers));
  }
  if (weights.size() != specs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("stack: ", specs.size(), " layer specs but ",
                                                   weights.size(), " sets of weights"));
  }
  // The layers hold no budget: the stack charges it for all of them, ahead of each batch.
  KvCacheConfig own = kv_config;
  own.budget = nullptr;
  std::vector<std::unique_ptr<AttentionLayer>> layers;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string field = absl::StrCat("stack.layers[", i, "]");
    if (specs[i].d_model != specs[0].d_model) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".d_model = ", specs[i].d_model, ", must equal stack.layers[0].d_model = ",
          specs[0].d_model, " (the width of the residual stream)"));
    }
    absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
        backend.CreateLayer(specs[i], weights[i], own);
    if (!layer.ok()) {
      return absl::Status(layer.status().code(),
                          absl::StrCat(field, ": ", layer.status().message()));
    }
    const KvPoolUsage usage = (*layer)->PoolUsage();
    if (i > 0 && (usage.page_size != layers[0]->PoolUsage().page_size ||
                  usage.page_bytes != layers[0]->PoolUsage().page_bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": KV pages of ", usage.page_size, " tokens and ", usage.page_bytes,
          " bytes, unlike stack.layers[0]'s (", layers[0]->PoolUsage().page_size, " tokens, ",
          layers[0]->PoolUsage().page_bytes,
          " bytes); the layers of a stack share one page layout (same KV heads and head dims)"));
    }
    layers.push_back(*std::move(layer));
  }
  KvCacheConfig stack_config = layers[0]->kv_config();
  stack_config.budget = kv_config.budget;
  return std::unique_ptr<LayerStack>(
      new LayerStack(std::move(layers), std::move(stack_config), mode));
}

LayerStack::LayerStack(std::vector<std::unique_ptr<AttentionLayer>> layers, KvCacheConfig kv_config,
                       StackMode mode)
    : layers_(std::move(layers)),
      mode_(mode),
      spec_(layers_[0]->spec()),
      kv_config_(std::move(kv_config)),
      reserved_pages_(layers_.size(), 0) {
  for (const auto& layer : layers_) {
    spec_.causal = spec_.causal && layer->spec().causal;
    const std::string kind = LayerKind(layer->spec());
    auto it = std::find_if(kinds_.begin(), kinds_.end(),
                           [&](const LayerKindKv& k) { return k.kind == kind; });
    if (it == kinds_.end()) it = kinds_.insert(kinds_.end(), LayerKindKv{kind, 0, 0});
    ++it->layers;
    kind_of_.push_back(static_cast<size_t>(it - kinds_.begin()));
  }
  kv_usage_->Set(kinds_);
}

LayerStack::~LayerStack() {
  layers_.clear();
  if (kv_config_.budget != nullptr && charged_ > 0) kv_config_.budget->Release(charged_);
  kv_usage_->Set(kinds_);  // Nothing held any more.
}

absl::StatusOr<const std::vector<SequenceId>*> LayerStack::Find(SequenceId sequence) const {
  auto it = sequences_.find(sequence);
  if (it != sequences_.end()) return &it->second;
  auto dropped = dropped_.find(sequence);
  if (dropped != dropped_.end()) {
    return absl::NotFoundError(
        absl::StrCat("sequence ", sequence, " was dropped from the stack: ", dropped->second));
  }
  return absl::NotFoundError(absl::StrCat("sequence ", sequence, " does not exist"));
}

int64_t LayerStack::UsedBytes() const {
  int64_t bytes = 0;
  for (const auto& layer : layers_) {
    const KvPoolUsage usage = layer->PoolUsage();
    bytes += usage.used_pages * usage.page_bytes;
  }
  for (size_t k = 0; k < layers_.size(); ++k) {
    bytes += reserved_pages_[k] * layers_[k]->PoolUsage().page_bytes;
  }
  return bytes + ahead_.total();
}

void LayerStack::DropAhead(SequenceId sequence) { ahead_.Release(sequence); }

void LayerStack::EndStep(SequenceId sequence) {
  auto it = steps_.find(sequence);
  if (it == steps_.end()) return;
  for (size_t k = 0; k < layers_.size(); ++k) reserved_pages_[k] -= it->second.reserved_pages[k];
  steps_.erase(it);
}

int LayerStack::NextLayer(SequenceId sequence) const {
  auto it = steps_.find(sequence);
  return it == steps_.end() ? 0 : it->second.next_layer;
}

void LayerStack::Settle() {
  const int64_t used = UsedBytes();
  KvMemoryBudget* budget = kv_config_.budget.get();
  if (budget == nullptr) {
    charged_ = used;
  } else if (used < charged_) {
    budget->Release(charged_ - used);
    charged_ = used;
  } else if (used > charged_ && budget->TryCharge(used - charged_)) {
    charged_ = used;  // Not reached: every growth is charged before it happens.
  }
  std::vector<LayerKindKv> kinds = kinds_;
  for (size_t k = 0; k < layers_.size(); ++k) {
    const KvPoolUsage usage = layers_[k]->PoolUsage();
    kinds[kind_of_[k]].kv_bytes += usage.used_pages * usage.page_bytes;
  }
  kv_usage_->Set(std::move(kinds));
}

SequenceId LayerStack::CreateSequence() {
  std::vector<SequenceId> ids;
  ids.reserve(layers_.size());
  for (const auto& layer : layers_) ids.push_back(layer->CreateSequence());
  const SequenceId id = next_id_++;
  sequences_.emplace(id, std::move(ids));
  return id;
}

absl::Status LayerStack::ReleaseSequence(SequenceId sequence) {
  if (dropped_.erase(sequence) > 0) return absl::OkStatus();  // Its pages went when it dropped.
  auto it = sequences_.find(sequence);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", sequence, " does not exist"));
  }
  for (size_t k = 0; k < layers_.size(); ++k) {
    layers_[k]->ReleaseSequence(it->second[k]).IgnoreError();  // Created with the stack's.
  }
  sequences_.erase(it);
  EndStep(sequence);
  DropAhead(sequence);
  Settle();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LayerStack::SequenceLength(SequenceId sequence) const {
  absl::StatusOr<const std::vector<SequenceId>*> ids = Find(sequence);
  if (!ids.ok()) return ids.status();
  return layers_[0]->SequenceLength((**ids)[0]);
}

absl::StatusOr<std::vector<SequenceId>> LayerStack::ForkSequence(SequenceId source, int count) {
  absl::StatusOr<const std::vector<SequenceId>*> found = Find(source);
  if (!found.ok()) return found.status();
  const std::vector<SequenceId> source_ids = **found;
  if (const int next = NextLayer(source); next != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence ", source, " is in mid-step (layers 0..", next - 1, " of ", layers_.size(),
        " ran it): fork it once layer ", layers_.size() - 1, " has run"));
  }
  std::vector<std::vector<SequenceId>> forks;  // [layer][fork]
  const auto undo = [&] {
    for (size_t k = 0; k < forks.size(); ++k) {
      for (SequenceId id : forks[k]) layers_[k]->ReleaseSequence(id).IgnoreError();
    }
    Settle();
  };
  for (size_t k = 0; k < layers_.size(); ++k) {
    absl::StatusOr<std::vector<SequenceId>> layer_forks =
        layers_[k]->ForkSequence(source_ids[k], count);
    if (!layer_forks.ok()) {
      undo();
      return layer_forks.status();
    }
    forks.push_back(*std::move(layer_forks));
  }
  // The copies of partial last pages, charged after the fact (their count is the layers' own).
  const int64_t grown = UsedBytes() - charged_;
  KvMemoryBudget* budget = kv_config_.budget.get();
  if (budget != nullptr && grown > 0) {
    if (!budget->TryCharge(grown)) {
      const KvPoolUsage usage = PoolUsage();
      absl::Status refused =
          KvBudgetExhaustedError(*budget, grown, grown / usage.page_bytes, usage.page_size,
                                 absl::StrCat("this fork (", layers_.size(), " stacked layers)"));
      undo();
      return refused;
    }
    charged_ += grown;
  }
  std::vector<SequenceId> ids;
  for (int j = 0; j < count; ++j) {
    std::vector<SequenceId> per_layer;
    for (size_t k = 0; k < layers_.size(); ++k) per_layer.push_back(forks[k][j]);
    ids.push_back(next_id_);
    sequences_.emplace(next_id_++, std::move(per_layer));
  }
  Settle();
  return ids;
}

absl::StatusOr<SequenceExport> LayerStack::ExportSequence(SequenceId sequence) const {
  absl::StatusOr<const std::vector<SequenceId>*> found = Find(sequence);
  if (!found.ok()) return found.status();
  // Mid-step, layers 0..next-1 hold one more step of tokens than the rest: no single length to
  // send, and the step's reservations cannot travel.
  if (const int next = NextLayer(sequence); next != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", sequence, " is mid-step (layers 0..", next - 1, " of ",
                     layers_.size(), " ran it; layer ", next, " runs next): move it once layer ",
                     layers_.size() - 1, " has run"));
  }
  SequenceExport stack;
  stack.page_bytes = layers_[0]->PoolUsage().page_bytes;
  for (size_t k = 0; k < layers_.size(); ++k) {
    absl::StatusOr<SequenceExport> part = layers_[k]->ExportSequence((**found)[k]);
    if (!part.ok()) {
      return absl::Status(part.status().code(),
                          absl::StrCat("layer ", k, ": ", part.status().message()));
    }
    if (k == 0) stack.num_tokens = part->num_tokens;
    stack.layers.push_back(LayerExtent{
        part->num_tokens, part->first_held_page,
        part->page_bytes == 0 ? 0 : static_cast<int64_t>(part->pages.size()) / part->page_bytes});
    stack.pages.append(part->pages);
  }
  return stack;
}

absl::Status LayerStack::ImportSequenceInto(const SequenceExport& exported, SequenceId into) {
  absl::StatusOr<const std::vector<SequenceId>*> found = Find(into);
  if (!found.ok()) return found.status();
  std::vector<SequenceId> ids = **found;  // Per layer; a failed layer's are replaced below.
  for (size_t k = 0; k < layers_.size(); ++k) {
    if (layers_[k]->SequenceLength(ids[k]).value_or(0) != 0 || steps_.contains(into)) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", into, " holds tokens; an import fills a new sequence"));
    }
  }
  // Every layer is checked before any imports: a refusal changes nothing.
  if (exported.layers.size() != layers_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers: the export holds ", exported.layers.size(), " layers, this stack ",
                     layers_.size(), " (a request moves between sessions of the same stack)"));
  }
  const int64_t page_bytes = layers_[0]->PoolUsage().page_bytes;
  if (exported.page_bytes != page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("page_bytes = ", exported.page_bytes,
                                                   ", this stack's layers store ", page_bytes));
  }
  int64_t held_pages = 0;
  for (size_t k = 0; k < layers_.size(); ++k) {
    const LayerExtent& part = exported.layers[k];
    if (part.num_tokens != exported.num_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers[", k, "].num_tokens = ", part.num_tokens, ", unlike the request's ",
                       exported.num_tokens,
                       " (a request moves between steps, when every layer holds the same)"));
    }
    if (part.held_pages < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers[", k, "].held_pages = ", part.held_pages, ", must be >= 0"));
    }
    const KvPoolUsage usage = layers_[k]->PoolUsage();
    const int64_t free = usage.capacity_pages - usage.used_pages - reserved_pages_[k];
    if (part.held_pages > free) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV cache pool exhausted: this import needs ", part.held_pages, " pages of ",
          usage.page_size, " tokens in layer ", k, ", ", free, " of ", usage.capacity_pages,
          " pages of that layer are free (reservations of steps in flight counted)"));
    }
    held_pages += part.held_pages;
  }
  if (static_cast<int64_t>(exported.pages.size()) != held_pages * page_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("pages: ", exported.pages.size(),
                                                   " bytes, the layers' held_pages sum to ",
                                                   held_pages, " pages of ", page_bytes, " bytes"));
  }
  // Charged once for every layer, as a step is at layer 0; the reservation (ReserveImport) is
  // charged already, and the pages draw on it first.
  const int64_t drawn = std::min(ahead_.Held(into), held_pages * page_bytes);
  const int64_t bytes = held_pages * page_bytes - drawn;
  KvMemoryBudget* budget = kv_config_.budget.get();
  if (budget != nullptr && bytes > 0) {
    if (!budget->TryCharge(bytes)) {
      return KvBudgetExhaustedError(*budget, bytes, bytes / page_bytes,
                                    layers_[0]->PoolUsage().page_size,
                                    absl::StrCat("this import (", layers_.size(), " layers)"));
    }
    charged_ += bytes;
  }
  size_t offset = 0;
  for (size_t k = 0; k < layers_.size(); ++k) {
    const LayerExtent& part = exported.layers[k];
    SequenceExport layer_part;
    layer_part.num_tokens = part.num_tokens;
    layer_part.first_held_page = part.first_held_page;
    layer_part.page_bytes = page_bytes;
    const size_t n = static_cast<size_t>(part.held_pages * page_bytes);
    layer_part.pages = exported.pages.substr(offset, n);
    offset += n;
    if (absl::Status s = layers_[k]->ImportSequenceInto(layer_part, ids[k]); !s.ok()) {
      // Undone: the layers before k give back what they took (their sequences empty again, under
      // new ids), Settle returns the charge, and the reservation stands undrawn.
      for (size_t j = 0; j < k; ++j) {
        layers_[j]->ReleaseSequence(ids[j]).IgnoreError();
        ids[j] = layers_[j]->CreateSequence();
      }
      sequences_[into] = std::move(ids);
      Settle();
      return absl::Status(s.code(), absl::StrCat("layers[", k, "]: ", s.message()));
    }
  }
  // The import is the reservation's one use: Settle gives back what it held beyond the pages.
  ahead_.Draw(into, drawn);
  ahead_.Release(into);
  Settle();
  return absl::OkStatus();
}

absl::Status LayerStack::FailAfterAppend(absl::string_view what, int layer, absl::string_view unit,
                                         absl::Span<const SequenceId> ids,
                                         const absl::Status& failure) {
  const std::string reason =
      absl::StrCat(what, " ", layer, " failed after layers 0..", layer - 1, " had appended the ",
                   unit, "'s tokens: ", failure.message());
  Drop(ids, reason);
  Settle();
  return absl::Status(failure.code(), absl::StrCat(reason, " (the batch's ", ids.size(),
                                                   " sequence(s) were dropped from every layer)"));
}

void LayerStack::Drop(absl::Span<const SequenceId> ids, const std::string& reason) {
  for (SequenceId id : ids) {
    auto it = sequences_.find(id);
    if (it == sequences_.end()) continue;
    for (size_t k = 0; k < layers_.size(); ++k) {
      layers_[k]->ReleaseSequence(it->second[k]).IgnoreError();
    }
    sequences_.erase(it);
    EndStep(id);
    DropAhead(id);
    dropped_.emplace(id, reason);
  }
}

template <typename Call>
absl::StatusOr<Tensor> LayerStack::Run(absl::Span<const SequenceId> ids,
                                       absl::Span<const int64_t> rows, const Tensor& hidden,
                                       const Call& call) {
  // Known and distinct ids: checked here too, since the pages are charged before layer 0 runs.
  std::vector<const std::vector<SequenceId>*> found;
  absl::flat_hash_set<SequenceId> seen;
  for (SequenceId id : ids) {
    absl::StatusOr<const std::vector<SequenceId>*> layer_ids = Find(id);
    if (!layer_ids.ok()) return layer_ids.status();
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", id, " appears more than once in one batch"));
    }
    found.push_back(*layer_ids);
  }
  // The pages every layer will allocate (a layer allocates for the whole batch before it evicts
  // what its window no longer sees): refused up front, nothing changed, if any pool or the budget
  // cannot hold them.
  std::vector<int64_t> seq_bytes(ids.size(), 0);  // Per sequence, over every layer.
  for (size_t k = 0; k < layers_.size(); ++k) {
    const KvPoolUsage usage = layers_[k]->PoolUsage();
    int64_t pages = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t length = layers_[k]->SequenceLength((*found[i])[k]).value_or(0);
      const int64_t seq_pages =
          std::max<int64_t>(0, PagesForTokens(length + std::max<int64_t>(rows[i], 0),
                                              static_cast<int>(usage.page_size)) -
                                   PagesForTokens(length, static_cast<int>(usage.page_size)));
      pages += seq_pages;
      seq_bytes[i] += seq_pages * usage.page_bytes;
    }
    if (pages > usage.capacity_pages - usage.used_pages) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV cache pool exhausted: this batch needs ", pages, " more pages of ", usage.page_size,
          " tokens in stack layer ", k, ", ", usage.capacity_pages - usage.used_pages, " of ",
          usage.capacity_pages, " pages of that layer are free"));
    }
  }
  // A sequence's reservation (ReserveKv) is charged already: its pages draw on that first.
  std::vector<int64_t> drawn(ids.size(), 0);
  int64_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    drawn[i] = std::min(ahead_.Held(ids[i]), seq_bytes[i]);
    bytes += seq_bytes[i] - drawn[i];
  }
  KvMemoryBudget* budget = kv_config_.budget.get();
  if (budget != nullptr && bytes > 0) {
    if (!budget->TryCharge(bytes)) {
      const KvPoolUsage usage = layers_[0]->PoolUsage();
      return KvBudgetExhaustedError(
          *budget, bytes, bytes / usage.page_bytes, usage.page_size,
          absl::StrCat("this batch (", layers_.size(), " stacked layers)"));
    }
    charged_ += bytes;
  }
  for (size_t i = 0; i < ids.size(); ++i) ahead_.Draw(ids[i], drawn[i]);

  // The residual stream in f32; layer k reads h and its output is added to h.
  Tensor h = hidden.CastTo(DType::kF32);
  std::vector<SequenceId> layer_ids(ids.size());
  for (size_t k = 0; k < layers_.size(); ++k) {
    for (size_t i = 0; i < ids.size(); ++i) layer_ids[i] = (*found[i])[k];
    absl::StatusOr<Tensor> out = call(*layers_[k], absl::MakeConstSpan(layer_ids), h);
    if (!out.ok()) {
      if (k > 0) {
        return FailAfterAppend("stack layer", static_cast<int>(k), "batch", ids, out.status());
      }
      // Nothing changed: the reservations stand as they were.
      for (size_t i = 0; i < ids.size(); ++i) ahead_.Restore(ids[i], drawn[i]);
      Settle();
      return out.status();
    }
    float* stream = h.f32();
    const float* add = out->f32();
    const int64_t n = h.num_elements();
    for (int64_t j = 0; j < n; ++j) stream[j] += add[j];
  }
  Settle();
  return hidden.dtype() == DType::kF32 ? std::move(h) : h.CastTo(hidden.dtype());
}

absl::StatusOr<Tensor> LayerStack::PrefillChecked(absl::Span<const PrefillChunk> chunks,
                                                  const Tensor& hidden,
                                                  absl::Span<const int64_t> positions) {
  if (mode_ != StackMode::kResidual) return WholeStackCallError();
  const ChunkSequences split = SplitChunks(chunks);
  std::vector<PrefillChunk> layer_chunks(chunks.begin(), chunks.end());
  return Run(split.ids, split.counts, hidden,
             [&](AttentionLayer& layer, absl::Span<const SequenceId> layer_ids, const Tensor& h) {
               for (size_t i = 0; i < layer_chunks.size(); ++i) {
                 layer_chunks[i].sequence = layer_ids[i];
               }
               return layer.Prefill(layer_chunks, h, positions);
             });
}

absl::StatusOr<Tensor> LayerStack::DecodeChecked(absl::Span<const SequenceId> sequences,
                                                 const Tensor& hidden,
                                                 absl::Span<const int64_t> positions) {
  if (mode_ != StackMode::kResidual) return WholeStackCallError();
  const std::vector<int64_t> rows(sequences.size(), 1);
  return Run(sequences, rows, hidden,
             [&](AttentionLayer& layer, absl::Span<const SequenceId> layer_ids, const Tensor& h) {
               return layer.Decode(layer_ids, h, positions);
             });
}

std::vector<int64_t> LayerStack::PagesNeeded(absl::Span<const std::vector<SequenceId>* const> found,
                                             absl::Span<const int64_t> rows,
                                             size_t first_layer) const {
  std::vector<int64_t> pages(layers_.size(), 0);
  for (size_t k = first_layer; k < layers_.size(); ++k) {
    const int page_size = static_cast<int>(layers_[k]->PoolUsage().page_size);
    for (size_t i = 0; i < found.size(); ++i) {
      const int64_t length = layers_[k]->SequenceLength((*found[i])[k]).value_or(0);
      pages[k] +=
          std::max<int64_t>(0, PagesForTokens(length + std::max<int64_t>(rows[i], 0), page_size) -
                                   PagesForTokens(length, page_size));
    }
  }
  return pages;
}

template <typename Call>
absl::StatusOr<Tensor> LayerStack::RunLayer(int layer, absl::Span<const SequenceId> ids,
                                            absl::Span<const int64_t> rows, const Tensor& hidden,
                                            const Call& call) {
  if (mode_ != StackMode::kPerLayer) return ResidualStackCallError();
  const int n = num_layers();
  if (layer < 0 || layer >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer = ", layer, ": out of range, the stack holds layers [0, ", n, ")"));
  }
  // Known, distinct, and each at this layer of its step (layer 0: no step in flight), with the
  // step's rows: checked before anything changes.
  std::vector<const std::vector<SequenceId>*> found;
  absl::flat_hash_set<SequenceId> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    absl::StatusOr<const std::vector<SequenceId>*> layer_ids = Find(ids[i]);
    if (!layer_ids.ok()) return layer_ids.status();
    if (!seen.insert(ids[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", ids[i], " appears more than once in one batch"));
    }
    found.push_back(*layer_ids);
    auto step = steps_.find(ids[i]);
    const int next = step == steps_.end() ? 0 : step->second.next_layer;
    if (next != layer) {
      return absl::FailedPreconditionError(
          layer == 0
              ? absl::StrCat("sequence ", ids[i],
                             ": layer 0 starts a new step, but its step ran "
                             "only layers 0..",
                             next - 1, " of ", n, "; run layer ", next, " next")
              : absl::StrCat("sequence ", ids[i], ": layer ", layer, " out of order, its step ",
                             next == 0 ? "has not started (layer 0 starts it)"
                                       : absl::StrCat("runs layer ", next, " next")));
    }
    if (layer > 0 && step->second.rows != rows[i]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", ids[i], ": layer ", layer, " gets ", rows[i], " tokens, but its step has ",
          step->second.rows, " (every layer of a step takes the same tokens)"));
    }
  }
  if (layer == 0) {
    // The pages every layer will allocate for the step, charged now: no later layer of the step
    // can run out of them.
    const std::vector<int64_t> pages = PagesNeeded(found, rows, 0);
    int64_t bytes = 0;
    for (size_t k = 0; k < layers_.size(); ++k) {
      const KvPoolUsage usage = layers_[k]->PoolUsage();
      const int64_t free = usage.capacity_pages - usage.used_pages - reserved_pages_[k];
      if (pages[k] > free) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "KV cache pool exhausted: this step needs ", pages[k], " more pages of ",
            usage.page_size, " tokens in layer ", k, ", ", free, " of ", usage.capacity_pages,
            " pages of that layer are free (reservations of steps in flight counted)"));
      }
      bytes += pages[k] * usage.page_bytes;
    }
    KvMemoryBudget* budget = kv_config_.budget.get();
    if (budget != nullptr && bytes > 0) {
      if (!budget->TryCharge(bytes)) {
        const KvPoolUsage usage = layers_[0]->PoolUsage();
        return KvBudgetExhaustedError(
            *budget, bytes, bytes / usage.page_bytes, usage.page_size,
            absl::StrCat("this step (", layers_.size(), " layers, charged at layer 0)"));
      }
      charged_ += bytes;
    }
    // Each sequence's own share, reserved per layer until that layer runs it.
    for (size_t i = 0; i < ids.size(); ++i) {
      Step step;
      step.rows = rows[i];
      step.reserved_pages =
          PagesNeeded(absl::MakeConstSpan(&found[i], 1), absl::MakeConstSpan(&rows[i], 1), 0);
      for (size_t k = 0; k < layers_.size(); ++k) reserved_pages_[k] += step.reserved_pages[k];
      steps_[ids[i]] = std::move(step);
    }
  }
  std::vector<SequenceId> layer_ids(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) layer_ids[i] = (*found[i])[static_cast<size_t>(layer)];
  // The layer allocates its pages itself: its reservation ends as it runs.
  for (SequenceId id : ids) {
    Step& step = steps_[id];
    reserved_pages_[static_cast<size_t>(layer)] -= step.reserved_pages[static_cast<size_t>(layer)];
    step.reserved_pages[static_cast<size_t>(layer)] = 0;
  }
  absl::StatusOr<Tensor> out =
      call(*layers_[static_cast<size_t>(layer)], absl::MakeConstSpan(layer_ids), hidden);
  if (!out.ok()) {
    if (layer > 0) return FailAfterAppend("layer", layer, "step", ids, out.status());
    for (SequenceId id : ids) EndStep(id);  // Layer 0 changed nothing: no step started.
    Settle();
    return out.status();
  }
  for (SequenceId id : ids) {
    auto step = steps_.find(id);
    if (++step->second.next_layer == n) EndStep(id);
  }
  Settle();
  return out;
}

absl::StatusOr<Tensor> LayerStack::PrefillLayer(int layer, absl::Span<const PrefillChunk> chunks,
                                                const Tensor& hidden,
                                                absl::Span<const int64_t> positions) {
  std::vector<SequenceId> ids;
  std::vector<int64_t> rows;
  for (const PrefillChunk& chunk : chunks) {
    ids.push_back(chunk.sequence);
    rows.push_back(chunk.num_tokens);
  }
  std::vector<PrefillChunk> layer_chunks(chunks.begin(), chunks.end());
  return RunLayer(
      layer, ids, rows, hidden,
      [&](AttentionLayer& target, absl::Span<const SequenceId> layer_ids, const Tensor& h) {
        for (size_t i = 0; i < layer_chunks.size(); ++i) {
          layer_chunks[i].sequence = layer_ids[i];
        }
        return target.Prefill(layer_chunks, h, positions);
      });
}

absl::StatusOr<Tensor> LayerStack::DecodeLayer(int layer, absl::Span<const SequenceId> sequences,
                                               const Tensor& hidden,
                                               absl::Span<const int64_t> positions) {
  const std::vector<int64_t> rows(sequences.size(), 1);
  return RunLayer(layer, sequences, rows, hidden,
                  [&](AttentionLayer& target, absl::Span<const SequenceId> layer_ids,
                      const Tensor& h) { return target.Decode(layer_ids, h, positions); });
}

KvPoolUsage LayerStack::PoolUsage() const {
  KvPoolUsage total = layers_[0]->PoolUsage();
  total.capacity_pages = 0;
  total.used_pages = 0;
  for (const auto& layer : layers_) {
    const KvPoolUsage usage = layer->PoolUsage();
    total.capacity_pages += usage.capacity_pages;
    total.used_pages += usage.used_pages;
  }
  return total;
}

absl::StatusOr<int64_t> LayerStack::SequenceKvBytes(SequenceId sequence) const {
  absl::StatusOr<const std::vector<SequenceId>*> ids = Find(sequence);
  if (!ids.ok()) return ids.status();
  int64_t bytes = 0;
  for (size_t k = 0; k < layers_.size(); ++k) {
    absl::StatusOr<int64_t> layer_bytes = layers_[k]->SequenceKvBytes((**ids)[k]);
    if (!layer_bytes.ok()) return layer_bytes.status();
    bytes += *layer_bytes;
  }
  return bytes;
}

int64_t LayerStack::KvBytesAtLength(int64_t num_tokens) const {
  int64_t bytes = 0;
  for (const auto& layer : layers_) bytes += layer->KvBytesAtLength(num_tokens);
  return bytes;
}

absl::Status LayerStack::ReserveKvFor(absl::Span<const SequenceId> sequences,
                                      absl::Span<const int64_t> num_tokens,
                                      absl::string_view what) {
  absl::flat_hash_set<SequenceId> seen;
  std::vector<int64_t> wanted(sequences.size(), 0);
  for (size_t i = 0; i < sequences.size(); ++i) {
    absl::StatusOr<const std::vector<SequenceId>*> found = Find(sequences[i]);
    if (!found.ok()) return found.status();
    if (!seen.insert(sequences[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", sequences[i], " appears more than once in one reservation"));
    }
    if (num_tokens[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", sequences[i], ": num_tokens = ", num_tokens[i], ", must be >= 0"));
    }
    for (size_t k = 0; k < layers_.size(); ++k) {
      const int64_t length = layers_[k]->SequenceLength((**found)[k]).value_or(0);
      wanted[i] += std::max<int64_t>(0, layers_[k]->KvBytesAtLength(length + num_tokens[i]) -
                                            layers_[k]->KvBytesAtLength(length));
    }
  }
  // The reservations settle their difference with the budget (a smaller one gives it back), which
  // charged_ follows.
  const int64_t before = ahead_.total();
  absl::Status set = ahead_.Set(
      sequences, wanted, kv_config_.budget.get(), [&](const KvMemoryBudget& budget, int64_t bytes) {
        const KvPoolUsage usage = layers_[0]->PoolUsage();
        return KvBudgetExhaustedError(budget, bytes, bytes / usage.page_bytes, usage.page_size,
                                      what);
      });
  if (!set.ok()) return set;
  charged_ += ahead_.total() - before;
  Settle();
  return absl::OkStatus();
}

int64_t LayerStack::ParameterBytes() const {
  int64_t bytes = 0;
  for (const auto& layer : layers_) bytes += layer->ParameterBytes();
  return bytes;
}

}  // namespace attnserve

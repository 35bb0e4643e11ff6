// Session's side of moving a request between replicas (ExportRequest / ImportRequest): the
// request's bookkeeping (length, positions) travels with its pages (AttentionLayer::ExportSequence
// and ImportSequenceInto). Both run on the session's queue, ordered with its steps like Fork; an
// import's bytes are reserved by the layer, on the queue too, when its header arrives
// (ReserveImport), and are the layer's from then on.
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/session/session.h"

namespace attnserve::server {

bool Session::HasRequest(const std::string& request_id) const {
  absl::MutexLock lock(&mu_);
  return requests_.contains(request_id);
}

absl::StatusOr<RequestExport> Session::ExportRequest(const std::string& request_id, bool release) {
  if (layer_ == nullptr || closed()) {
    return absl::NotFoundError(absl::StrCat("session '", id_, "' was released or expired"));
  }
  if (release) {
    if (absl::Status s = drain_seal_.Check(1); !s.ok()) return s;
  }
  RequestState state;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<RequestState*> found = UseRequestLocked(request_id);
    if (!found.ok()) return found.status();
    state = **found;
  }
  if (state.step_layer != 0) {
    // Layers 0..step_layer-1 hold the step's tokens and the rest do not: wait for its end.
    return absl::FailedPreconditionError(
        absl::StrCat("request '", request_id, "' of model session '", id_,
                     "' is mid-step: its step ran layers 0..", state.step_layer - 1, " of ",
                     num_layers_, " and runs layer ", state.step_layer,
                     " next; export it once layer ", num_layers_ - 1, " has run (or Release it)"));
  }
  absl::StatusOr<SequenceExport> kv = layer_->ExportSequence(state.sequence);
  if (!kv.ok()) return kv.status();
  if (release) {
    // In the same queue step as the copy: no step can land on the source after it was copied.
    {
      absl::MutexLock lock(&mu_);
      if (auto it = requests_.find(request_id); it != requests_.end()) {
        DropRetained(it->second);
        requests_.erase(it);
      }
    }
    layer_->ReleaseSequence(state.sequence).IgnoreError();
    RefreshKvBytes();
  }
  return RequestExport{*std::move(kv), state.last_position};
}

absl::StatusOr<SequenceId> Session::ReserveImport(int64_t num_tokens) {
  if (layer_ == nullptr || closed()) {
    return absl::NotFoundError(absl::StrCat("session '", id_, "' was released or expired"));
  }
  const SequenceId sequence = layer_->CreateSequence();
  if (absl::Status s = layer_->ReserveImport(sequence, num_tokens); !s.ok()) {
    layer_->ReleaseSequence(sequence).IgnoreError();
    return s;
  }
  return sequence;
}

void Session::AbandonImport(SequenceId reserved) {
  // A closed session's layer went with its sequences and reservations.
  if (layer_ == nullptr) return;
  layer_->ReleaseSequence(reserved).IgnoreError();
}

absl::StatusOr<ImportOutcome> Session::ImportRequest(const std::string& request_id,
                                                     const RequestExport& exported,
                                                     SequenceId reserved) {
  absl::StatusOr<ImportOutcome> outcome = ImportReserved(request_id, exported, reserved);
  if (!outcome.ok()) AbandonImport(reserved);
  return outcome;
}

absl::StatusOr<ImportOutcome> Session::ImportReserved(const std::string& request_id,
                                                      const RequestExport& exported,
                                                      SequenceId reserved) {
  if (layer_ == nullptr || closed()) {
    return absl::NotFoundError(absl::StrCat("session '", id_, "' was released or expired"));
  }
  if (absl::Status s = drain_seal_.Check(1); !s.ok()) return s;
  const int64_t length = exported.kv.num_tokens;
  if (length > limits_.max_sequence_length) {
    return absl::OutOfRangeError(absl::StrCat("sequence_length = ", length,
                                              " passes this session's max_sequence_length (",
                                              limits_.max_sequence_length, ")"));
  }
  if (exported.last_position < -1 || (length > 0 && exported.last_position < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("last_position = ", exported.last_position,
                                                   ", must be >= ", length > 0 ? 0 : -1,
                                                   " for a request of ", length, " tokens"));
  }
  {
    absl::MutexLock lock(&mu_);
    last_used_ = absl::Now();
    if (requests_.contains(request_id)) {
      return absl::AlreadyExistsError(absl::StrCat("request_id: request '", request_id,
                                                   "' already exists in session '", id_, "'"));
    }
    if (static_cast<int64_t>(requests_.size()) >= limits_.max_requests) {
      return absl::ResourceExhaustedError(
          absl::StrCat("session '", id_, "' has ", requests_.size(),
                       " requests, its max_requests (release requests or raise the limit)"));
    }
  }
  const int64_t before = kv_bytes_used();
  if (absl::Status s = layer_->ImportSequenceInto(exported.kv, reserved); !s.ok()) return s;
  RefreshKvBytes();
  RequestState state;
  state.sequence = reserved;
  state.length = layer_->SequenceLength(reserved).value_or(length);  // The layer's count.
  state.last_position = exported.last_position;
  state.kv_bytes = layer_->SequenceKvBytes(reserved).value_or(0);
  state.last_used = absl::Now();
  absl::MutexLock lock(&mu_);
  requests_.emplace(request_id, std::move(state));
  return ImportOutcome{length, kv_bytes_used() - before};
}

}  // namespace attnserve::server

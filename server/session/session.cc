#include "server/session/session.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/base/clip_for_message.h"
#include "server/session/call_digest.h"
#include "server/session/scheduler.h"

namespace attnserve::server {

namespace {

absl::Status SessionClosedError(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("session '", id, "' was released or expired"));
}

}  // namespace

void DrainSeal::Seal(std::string message, RefusalObserver on_refused) {
  absl::MutexLock lock(&mu_);
  if (sealed_.load(std::memory_order_relaxed)) return;
  message_ = std::move(message);
  on_refused_ = std::move(on_refused);
  sealed_.store(true, std::memory_order_release);
}

absl::Status DrainSeal::Check(int64_t requests) {
  if (!sealed()) return absl::OkStatus();
  refused_.fetch_add(requests, std::memory_order_relaxed);
  RefusalObserver observer;
  std::string message;
  {
    absl::MutexLock lock(&mu_);
    observer = on_refused_;
    message = message_;
  }
  if (observer) observer(requests);
  return absl::UnavailableError(std::move(message));
}

Session::Session(std::string id, std::string label, const LayerSpec& spec, DType kv_dtype,
                 SessionLimits limits, std::unique_ptr<AttentionLayer> layer, SessionCost cost,
                 Executor* executor, SchedulerContext scheduler)
    : id_(std::move(id)),
      label_(std::move(label)),
      spec_(spec),
      kv_dtype_(kv_dtype),
      limits_(limits),
      cost_(std::move(cost)),
      page_size_(layer->PoolUsage().page_size),
      page_bytes_(layer->PoolUsage().page_bytes),
      kv_storage_(layer->kv_config().storage),
      queue_(Strand::Create(executor)),
      layer_(std::move(layer)),
      scheduler_(std::make_unique<SessionScheduler>(this, std::move(scheduler))),
      retained_(std::make_shared<RetainedOutputs>(kDefaultRetainedOutputBytes, 0)),
      last_used_(absl::Now()) {}

Session::~Session() {
  absl::MutexLock lock(&mu_);
  for (auto& [request_id, state] : requests_) DropRetained(state);
}

void Session::SetRetainedOutputs(std::shared_ptr<RetainedOutputs> store, std::string tenant,
                                 bool tenant_bounded) {
  retained_ = std::move(store);
  tenant_ = std::move(tenant);
  tenant_bounded_ = tenant_bounded;
}

void Session::RefreshKvBytes() {
  const KvPoolUsage usage = layer_ != nullptr ? layer_->PoolUsage() : KvPoolUsage{};
  kv_bytes_used_.store(usage.used_pages * usage.page_bytes, std::memory_order_relaxed);
}

absl::StatusOr<bool> Session::FillReplayLocked(const std::string& call_id, StepPlan& plan) {
  std::vector<const RequestState*> states;
  const std::string* applied = nullptr;
  const std::string* not_applied = nullptr;
  for (const StepInput& in : plan.inputs) {
    auto it = requests_.find(in.request_id);
    const bool was_applied = it != requests_.end() && it->second.last_call_id == call_id;
    (was_applied ? applied : not_applied) = &in.request_id;
    if (was_applied) states.push_back(&it->second);
  }
  if (applied == nullptr) return false;
  if (not_applied != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "call_id '", ClipForMessage(call_id), "' was the last call applied to request '",
        ClipForMessage(*applied), "' but not to request '", ClipForMessage(*not_applied),
        "': a call_id names one call, so reuse it only to retry that call with the same items"));
  }
  for (const RequestState* state : states) {
    if (state->last_input_digest != plan.input_digest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "call_id: '", ClipForMessage(call_id), "' was already used by a call with other inputs "
          "(request '", ClipForMessage(*applied), "'); a call_id names one call: retry it with the "
          "same items, or send a new call under a new call_id"));
    }
  }
  std::vector<StepOutput> replayed;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    std::optional<Tensor> output = retained_->Get(states[i]->last_output);
    if (!output.has_value()) {
      // Applied, so it must not run again (the request's KV cache already holds its tokens), and
      // its answer is gone: only the caller can decide how to go on.
      return absl::FailedPreconditionError(absl::StrCat(
          "call_id '", ClipForMessage(call_id), "' was already applied to request '",
          ClipForMessage(plan.inputs[i].request_id),
          "' but its output is no longer retained (evicted to stay under "
          "--max_retained_output_bytes, or larger than it); it cannot run twice: read the "
          "request's length with GetSession and go on under a new call_id"));
    }
    replayed.push_back(
        StepOutput{plan.inputs[i].request_id, *std::move(output), states[i]->length});
  }
  plan.replay = true;
  plan.replayed = std::move(replayed);
  return true;
}

absl::Status Session::CheckLayer(int layer) const {
  if (per_layer_) {
    if (layer < 0 || layer >= num_layers_) {
      return absl::InvalidArgumentError(absl::StrCat("layer = ", layer,
                                                     ": out of range, model session '", id_,
                                                     "' holds layers [0, ", num_layers_, ")"));
    }
    return absl::OkStatus();
  }
  if (layer != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer = ", layer, ": session '", id_,
        "' is not a model session (only sessions configured with stack.per_layer take a layer "
        "index; leave it 0)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepPlan> Session::ContinueStepLocked(std::vector<StepInput> inputs, StepPlan plan) {
  const int layer = plan.layer;
  for (size_t i = 0; i < inputs.size(); ++i) {
    StepInput& in = inputs[i];
    const std::string where = absl::StrCat("items[", i, "]: layer ", layer, " of request '",
                                           ClipForMessage(in.request_id), "'");
    auto it = requests_.find(in.request_id);
    if (it == requests_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": the request is not in model session '", id_,
                       "' (a step starts at layer 0, which creates a new request)"));
    }
    const RequestState& state = it->second;
    if (state.step_layer != layer) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, " out of order: ",
          state.step_layer == 0 ? "no step is in flight (layer 0 starts one)"
                                : absl::StrCat("its step ran layers 0..", state.step_layer - 1,
                                               " and runs layer ", state.step_layer, " next")));
    }
    const int64_t rows = in.hidden.dim(0);
    if (rows != static_cast<int64_t>(state.step_positions.size())) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": ", rows, " tokens, but its step (started at layer 0) has ",
          state.step_positions.size(), "; every layer of a step takes the same tokens"));
    }
    if (!in.positions.empty() && in.positions != state.step_positions) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": positions differ from its step's (from ", state.step_positions.front(),
          " as layer 0 took them); give the same positions, or none"));
    }
    in.positions = state.step_positions;
    plan.requests[i].sequence = state.sequence;
    plan.requests[i].length = state.length;
    if (i > 0 && in.hidden.dtype() != inputs[0].hidden.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].hidden: dtype ", DTypeName(in.hidden.dtype()), " differs from items[0] (",
          DTypeName(inputs[0].hidden.dtype()), "); one call takes one dtype"));
    }
  }
  plan.inputs = std::move(inputs);
  return plan;
}

absl::StatusOr<StepPlan> Session::Plan(std::vector<StepInput> inputs, bool decode,
                                       const std::string& call_id, int layer) {
  return PlanRows(std::move(inputs), decode, call_id, layer, {});
}

absl::StatusOr<StepPlan> Session::PlanStreamedForward(std::vector<StepInput> inputs,
                                                      absl::Span<const int64_t> rows) {
  if (per_layer_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session '", id_, "' is a model session: its Forward runs one layer on all of a step's rows "
        "in one call, which a stream cannot split; use Forward"));
  }
  if (rows.size() != inputs.size()) {
    return absl::InternalError("PlanStreamedForward: one row count per input");
  }
  absl::StatusOr<StepPlan> plan = PlanRows(std::move(inputs), /*decode=*/false, "", 0, rows);
  if (!plan.ok()) return plan;
  for (size_t i = 0; i < plan->inputs.size(); ++i) {
    // Rows appended to an existing request could not be taken back if the stream then failed.
    if (!plan->requests[i].is_new) {
      return absl::AlreadyExistsError(absl::StrCat(
          "items[", i, "].request_id: request '", ClipForMessage(plan->inputs[i].request_id),
          "' already exists in session '", id_,
          "'; ForwardStream creates new requests only (extend one with Forward)"));
    }
  }
  return plan;
}

absl::StatusOr<StepPlan> Session::PlanRows(std::vector<StepInput> inputs, bool decode,
                                           const std::string& call_id, int layer,
                                           absl::Span<const int64_t> row_counts) {
  if (layer_ == nullptr || closed()) return SessionClosedError(id_);
  if (absl::Status s = drain_seal_.Check(static_cast<int64_t>(inputs.size())); !s.ok()) return s;
  if (inputs.empty()) return absl::InvalidArgumentError("items: must not be empty");
  if (absl::Status s = CheckLayer(layer); !s.ok()) return s;
  StepPlan plan;
  plan.decode = decode;
  plan.layer = layer;
  plan.call_id = call_id;
  plan.requests.resize(inputs.size());
  absl::MutexLock lock(&mu_);
  last_used_ = absl::Now();
  if (!call_id.empty()) {
    // A retry of a call that was applied (its answer lost to a deadline, a cancellation or the
    // network) is answered from what that call left, before any check that its inputs, now
    // stale against the request's state, would fail.
    plan.inputs = std::move(inputs);
    plan.input_digest = CallInputDigest(plan.inputs, decode);
    // A model session's call_id names a call on one layer: a retry must name the same layer.
    if (per_layer_) absl::StrAppend(&plan.input_digest, "/layer ", layer);
    absl::StatusOr<bool> replay = FillReplayLocked(call_id, plan);
    if (!replay.ok()) return replay.status();
    if (*replay) return plan;
    inputs = std::move(plan.inputs);
    plan.inputs.clear();
  }
  if (per_layer_ && layer > 0) return ContinueStepLocked(std::move(inputs), std::move(plan));
  int new_requests = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const StepInput& in = inputs[i];
    const int64_t rows = row_counts.empty() ? in.hidden.dim(0) : row_counts[i];
    int64_t length = 0;
    int64_t last_position = -1;
    auto it = requests_.find(in.request_id);
    if (it == requests_.end()) {
      if (decode) {
        return absl::NotFoundError(absl::StrCat(
            "items[", i, "].request_id: request '", in.request_id, "' not found in session '", id_,
            "' (create it with Forward; it may have been released or expired)"));
      }
      plan.requests[i].is_new = true;
      ++new_requests;
    } else {
      plan.requests[i].sequence = it->second.sequence;
      // The layer's count, its one owner (on the queue the layer is idle: a short call).
      length = layer_->SequenceLength(it->second.sequence).value_or(it->second.length);
      last_position = it->second.last_position;
      if (it->second.step_layer != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("items[", i, "]: layer 0 of request '", ClipForMessage(in.request_id),
                         "' starts a new step, but its step in flight ran only layers 0..",
                         it->second.step_layer - 1, " of ", num_layers_, "; run layer ",
                         it->second.step_layer, " next (or Release the request)"));
      }
    }
    plan.requests[i].length = length;
    if (!in.positions.empty()) {
      if (static_cast<int64_t>(in.positions.size()) != rows) {
        return absl::InvalidArgumentError(
            absl::StrCat("items[", i, "].positions: has ", in.positions.size(),
                         " entries, expected one per token (", rows, ") or none"));
      }
      for (size_t t = 0; t < in.positions.size(); ++t) {
        if (in.positions[t] < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "items[", i, "].positions[", t, "] = ", in.positions[t], ", must be >= 0"));
        }
        if (t > 0 && in.positions[t] <= in.positions[t - 1]) {
          return absl::InvalidArgumentError(absl::StrCat(
              "items[", i, "].positions[", t, "] = ", in.positions[t],
              ", must be greater than positions[", t - 1, "] = ", in.positions[t - 1]));
        }
      }
      if (in.positions[0] <= last_position) {
        return absl::InvalidArgumentError(
            absl::StrCat("items[", i, "].positions[0] = ", in.positions[0],
                         ", must be after the last position (", last_position, ") of request '",
                         in.request_id, "'"));
      }
    } else if (length <= last_position) {
      // Earlier explicit positions ran ahead of the length; implicit ones would go backwards.
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "].positions: empty means positions from the request's length ",
                       length, ", which is not after the last position (", last_position,
                       ") of request '", in.request_id, "'; give positions explicitly"));
    }
    if (length + rows > limits_.max_sequence_length) {
      return absl::OutOfRangeError(
          absl::StrCat("items[", i, "]: request '", in.request_id, "' would hold ", length + rows,
                       " tokens, over max_sequence_length = ", limits_.max_sequence_length));
    }
    if (i > 0 && in.hidden.dtype() != inputs[0].hidden.dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].hidden: dtype ", DTypeName(in.hidden.dtype()), " differs from items[0] (",
          DTypeName(inputs[0].hidden.dtype()), "); one call takes one dtype"));
    }
  }
  if (new_requests > 0 &&
      static_cast<int64_t>(requests_.size()) + new_requests > limits_.max_requests) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session '", id_, "' has ", requests_.size(), " requests; ", new_requests,
                     " more would pass max_requests = ", limits_.max_requests,
                     " (release requests or raise the limit)"));
  }
  // RoPE positions, resolved here once: an input without positions continues from its request's
  // length, so every engine call gets one position per row, which the backends use as given
  // (ResolvePositions, kernels/kv/sequence_table.h, fills them in only for callers that give none).
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int64_t>& positions = inputs[i].positions;
    if (!positions.empty()) continue;
    positions.resize(
        static_cast<size_t>(row_counts.empty() ? inputs[i].hidden.dim(0) : row_counts[i]));
    for (size_t t = 0; t < positions.size(); ++t) {
      positions[t] = plan.requests[i].length + static_cast<int64_t>(t);
    }
  }
  plan.inputs = std::move(inputs);
  return plan;
}

absl::Status Session::GatherRows(const StepPlan& plan, Tensor* hidden,
                                 std::vector<int64_t>* positions) {
  std::byte* dst = hidden->data();
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const Tensor& h = plan.inputs[i].hidden;
    if (h.dtype() != hidden->dtype()) {
      return absl::InvalidArgumentError(absl::StrCat("hidden: dtype ", DTypeName(h.dtype()),
                                                     " differs from the batch's (",
                                                     DTypeName(hidden->dtype()), ")"));
    }
    std::memcpy(dst, h.data(), h.num_bytes());
    dst += h.num_bytes();
    positions->insert(positions->end(), plan.inputs[i].positions.begin(),
                      plan.inputs[i].positions.end());
  }
  return absl::OkStatus();
}

std::vector<Tensor> Session::AllocateOutputs(const StepPlan& plan, DType dtype, bool with_rows) {
  std::vector<Tensor> outputs;
  outputs.reserve(plan.inputs.size());
  for (const StepInput& in : plan.inputs) {
    outputs.emplace_back(dtype,
                         std::vector<int64_t>{with_rows ? in.hidden.dim(0) : 0, spec_.d_model});
  }
  int new_requests = 0;
  for (const StepPlan::Request& r : plan.requests) new_requests += r.is_new ? 1 : 0;
  absl::MutexLock lock(&mu_);
  requests_.reserve(requests_.size() + static_cast<size_t>(new_requests));
  return outputs;
}

std::vector<StepOutput> Session::Commit(StepPlan& plan, const Tensor& out, int64_t first_row,
                                        absl::Time now, std::vector<Tensor> outputs) {
  std::vector<StepOutput> results(plan.inputs.size());
  // The layer owns the accounting and the lengths (its sequence table): each request's bytes as
  // its pages now hold them and its length as the layer counts it; the request's state keeps a
  // copy for readers on other threads (Snapshot, the scheduler's batch sizing), refreshed here
  // after every engine call.
  std::vector<int64_t> kv_bytes(plan.inputs.size(), 0);
  std::vector<int64_t> lengths(plan.inputs.size(), 0);
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    kv_bytes[i] = layer_->SequenceKvBytes(plan.requests[i].sequence).value_or(0);
    lengths[i] = layer_->SequenceLength(plan.requests[i].sequence)
                     .value_or(plan.requests[i].length + plan.inputs[i].hidden.dim(0));
  }
  absl::MutexLock lock(&mu_);
  last_used_ = now;
  const size_t row_bytes = static_cast<size_t>(spec_.d_model) * DTypeSize(out.dtype());
  const std::byte* src = out.data() + static_cast<size_t>(first_row) * row_bytes;
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    const int64_t rows = plan.inputs[i].hidden.dim(0);
    RequestState& state = requests_[plan.inputs[i].request_id];
    state.sequence = plan.requests[i].sequence;
    state.length = lengths[i];
    state.last_position = plan.inputs[i].positions.back();
    if (per_layer_) {
      // The step advances one layer; layer 0 started it (the length and positions moved then).
      state.step_layer = plan.layer + 1 < num_layers_ ? plan.layer + 1 : 0;
      if (plan.layer == 0) state.step_positions = plan.inputs[i].positions;
      if (state.step_layer == 0) state.step_positions.clear();
    }
    state.kv_bytes = kv_bytes[i];
    state.last_used = now;
    StepOutput& r = results[i];
    r.request_id = std::move(plan.inputs[i].request_id);
    r.output = std::move(outputs[i]);
    if (rows > 0) {  // A streamed Forward's rows went to its caller chunk by chunk.
      std::memcpy(r.output.data(), src, static_cast<size_t>(rows) * row_bytes);
      src += static_cast<size_t>(rows) * row_bytes;
    }
    r.sequence_length = state.length;
    state.last_call_id = plan.call_id;
    state.last_input_digest = plan.call_id.empty() ? std::string() : plan.input_digest;
    DropRetained(state);
    if (!plan.call_id.empty()) {
      try {
        state.last_output = retained_->Put(tenant_, tenant_bounded_, r.output);
      } catch (const std::bad_alloc&) {
        // Not retained: a retry answers as for an evicted output.
      }
    }
  }
  return results;
}

absl::Status Session::RunDecode(absl::Span<StepPlan* const> plans, int64_t* compute_ns,
                                std::vector<std::vector<StepOutput>>* outputs) {
  *compute_ns = 0;
  if (layer_ == nullptr || closed()) return SessionClosedError(id_);
  if (plans.empty()) return absl::OkStatus();
  int64_t total_rows = 0;
  for (StepPlan* plan : plans) {
    total_rows += static_cast<int64_t>(plan->inputs.size());
    // One engine call runs one layer; the scheduler batches only calls on one layer together.
    if (plan->layer != plans[0]->layer) {
      return absl::InternalError(
          absl::StrCat("a decode batch mixes layers ", plans[0]->layer, " and ", plan->layer));
    }
  }
  // One engine call takes one dtype; the scheduler batches only calls of one dtype together.
  Tensor hidden(plans[0]->inputs[0].hidden.dtype(), {total_rows, spec_.d_model});
  std::vector<int64_t> positions;
  std::vector<SequenceId> ids;
  ids.reserve(static_cast<size_t>(total_rows));
  {
    std::byte* dst = hidden.data();
    const size_t row_bytes = static_cast<size_t>(spec_.d_model) * DTypeSize(hidden.dtype());
    for (StepPlan* plan : plans) {
      Tensor part(hidden.dtype(), {static_cast<int64_t>(plan->inputs.size()), spec_.d_model});
      if (absl::Status s = GatherRows(*plan, &part, &positions); !s.ok()) {
        return s;
      }
      std::memcpy(dst, part.data(), part.num_bytes());
      dst += plan->inputs.size() * row_bytes;
      for (const StepPlan::Request& r : plan->requests) ids.push_back(r.sequence);
    }
  }
  // Everything Commit needs is allocated before the engine call: once it appended, recording it
  // cannot fail for want of memory.
  std::vector<std::vector<Tensor>> results;
  for (StepPlan* plan : plans) results.push_back(AllocateOutputs(*plan, hidden.dtype()));
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Tensor> out = absl::UnknownError("not run");
  try {
    out = model_ != nullptr ? model_->DecodeLayer(plans[0]->layer, ids, hidden, positions)
                            : layer_->Decode(ids, hidden, positions);
  } catch (const std::bad_alloc&) {
    out = OutOfMemoryError("this Decode batch");
  }
  *compute_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  RefreshKvBytes();
  if (!out.ok()) return out.status();
  const absl::Time now = absl::Now();
  outputs->clear();
  int64_t row = 0;
  for (size_t p = 0; p < plans.size(); ++p) {
    StepPlan* plan = plans[p];
    outputs->push_back(Commit(*plan, *out, row, now, std::move(results[p])));
    row += static_cast<int64_t>(outputs->back().size());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PrefillRun>> Session::StartPrefill(StepPlan plan,
                                                                  int64_t chunk_tokens) {
  return StartPrefillRun(std::move(plan), chunk_tokens, /*streamed=*/false);
}

absl::StatusOr<std::unique_ptr<PrefillRun>> Session::StartStreamedPrefill(StepPlan plan,
                                                                          int64_t chunk_tokens) {
  return StartPrefillRun(std::move(plan), chunk_tokens, /*streamed=*/true);
}

absl::StatusOr<std::unique_ptr<PrefillRun>> Session::StartPrefillRun(StepPlan plan,
                                                                     int64_t chunk_tokens,
                                                                     bool streamed) {
  if (layer_ == nullptr || closed()) return SessionClosedError(id_);
  std::unique_ptr<PrefillRun> run(new PrefillRun());
  run->streamed_ = streamed;
  run->dtype_ = plan.inputs[0].hidden.dtype();
  // Plan resolved one position per row, so they count the rows whether or not they are here.
  for (const StepInput& in : plan.inputs) {
    run->total_rows_ += static_cast<int64_t>(in.positions.size());
  }
  if (streamed) {
    for (const StepInput& in : plan.inputs) {
      run->positions_.insert(run->positions_.end(), in.positions.begin(), in.positions.end());
    }
  } else {
    run->hidden_ = Tensor(run->dtype_, {run->total_rows_, spec_.d_model});
    if (absl::Status s = GatherRows(plan, &run->hidden_, &run->positions_); !s.ok()) {
      return s;
    }
  }
  // A model session's step runs each layer on all its rows in one call (chunks of layer 0 would
  // each start a step), so its Forward is never chunked.
  if (chunk_tokens <= 0 || !spec_.causal || model_ != nullptr) chunk_tokens = run->total_rows_;
  run->chunk_tokens_ = chunk_tokens;
  // Allocated before anything changes (see RunDecode). A streamed run hands each chunk's output
  // to its caller instead, and records zero-row results.
  run->out_ = Tensor(run->dtype_, {streamed ? 0 : run->total_rows_, spec_.d_model});
  run->results_ = AllocateOutputs(plan, run->dtype_, /*with_rows=*/!streamed);
  run->row_start_.assign(plan.inputs.size() + 1, 0);
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    run->row_start_[i + 1] =
        run->row_start_[i] + static_cast<int64_t>(plan.inputs[i].positions.size());
  }

  // Nothing below allocates but the layer's sequence entries and the set of requests in a
  // prefill.
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < plan.inputs.size(); ++i) {
      if (!plan.requests[i].is_new) in_prefill_.insert(plan.inputs[i].request_id);
    }
  }
  run->plan_ = std::move(plan);
  for (StepPlan::Request& r : run->plan_.requests) {
    if (r.is_new) r.sequence = layer_->CreateSequence();
  }
  run->started_ = true;
  // A chunked Forward has the layer reserve its KV bytes first (see the header): each chunk's
  // pages draw on the reservation, never released and charged again. A streamed one always
  // does: a prompt that cannot fit is refused before the client uploads it.
  if (streamed || chunk_tokens < run->total_rows_) {
    std::vector<SequenceId> ids;
    std::vector<int64_t> rows;
    for (size_t i = 0; i < run->plan_.inputs.size(); ++i) {
      ids.push_back(run->plan_.requests[i].sequence);
      rows.push_back(run->row_start_[i + 1] - run->row_start_[i]);
    }
    if (absl::Status s = layer_->ReserveKv(ids, rows); !s.ok()) return UndoPrefill(*run, s);
    run->reserved_ = true;
  }
  return run;
}

void Session::EndPrefillLocked(const PrefillRun& run) {
  for (const StepInput& in : run.plan_.inputs) in_prefill_.erase(in.request_id);
}

absl::Status Session::UndoPrefill(PrefillRun& run, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    EndPrefillLocked(run);
  }
  run.over_ = true;
  run.next_row_ = run.total_rows_;
  if (layer_ != nullptr && run.started_) {
    for (const StepPlan::Request& r : run.plan_.requests) {
      if (r.is_new && r.sequence != 0) layer_->ReleaseSequence(r.sequence).IgnoreError();
    }
  }
  GiveBackReservation(run);
  RefreshKvBytes();
  return status;
}

void Session::AbortPrefill(PrefillRun& run) {
  if (!run.over_) UndoPrefill(run, absl::AbortedError("prefill abandoned")).IgnoreError();
}

absl::Status Session::RunPrefillChunk(PrefillRun& run) {
  if (run.over_ || run.all_chunks_ran() || run.streamed_) {
    return absl::FailedPreconditionError("RunPrefillChunk: the prefill run is over (or streamed)");
  }
  const int64_t begin = run.next_row_;
  const int64_t end = std::min(run.total_rows_, begin + run.chunk_tokens_);
  const size_t row_bytes = static_cast<size_t>(spec_.d_model) * DTypeSize(run.dtype_);
  absl::StatusOr<Tensor> out = RunRows(run, end, run.hidden_, begin);
  if (!out.ok()) return out.status();
  if (begin == 0 && end == run.total_rows_) {
    run.out_ = *std::move(out);  // One chunk ran the whole run: no copy of its output.
  } else {
    std::memcpy(run.out_.data() + static_cast<size_t>(begin) * row_bytes, out->data(),
                static_cast<size_t>(end - begin) * row_bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Session::RunStreamedChunk(PrefillRun& run, const Tensor& rows) {
  if (run.over_ || run.all_chunks_ran() || !run.streamed_) {
    return absl::FailedPreconditionError("RunStreamedChunk: the prefill run is over");
  }
  if (rows.rank() != 2 || rows.dim(1) != spec_.d_model || rows.dtype() != run.dtype_ ||
      rows.dim(0) < 1 || rows.dim(0) > run.total_rows_ - run.next_row_) {
    return UndoPrefill(run, absl::InternalError(absl::StrCat(
                                "RunStreamedChunk: rows ", ShapeString(rows.shape()),
                                " do not continue the run (", run.next_row_, " of ",
                                run.total_rows_, " rows ran)")));
  }
  return RunRows(run, run.next_row_ + rows.dim(0), rows, 0);
}

absl::StatusOr<Tensor> Session::RunRows(PrefillRun& run, int64_t end, const Tensor& source,
                                        int64_t source_row) {
  // The session may have closed between two chunks (Close is held back until the Forward is
  // over, but MarkClosing and a session-TTL close are not).
  if (layer_ == nullptr || closed()) return UndoPrefill(run, SessionClosedError(id_));
  StepPlan& plan = run.plan_;
  const int64_t begin = run.next_row_;
  // Fails the run at this chunk: what earlier chunks appended to existing requests stands and is
  // recorded; the run is undone.
  const auto fail = [&](const absl::Status& status) {
    if (begin > 0) {
      // Only a sliding window's eviction arithmetic, an allocation failure or a drain's seal can
      // get here (the reservation covers the rest): earlier chunks stand, so record them first.
      for (size_t i = 0; i < plan.inputs.size(); ++i) {
        if (plan.requests[i].is_new || run.row_start_[i] >= begin) continue;
        const SequenceId sequence = plan.requests[i].sequence;
        const int64_t kv_bytes = layer_->SequenceKvBytes(sequence).value_or(0);
        // The length as the layer's ledger counts it (its one owner); the rows of the chunks run
        // are what it must be.
        const int64_t length = layer_->SequenceLength(sequence).value_or(
            plan.requests[i].length + (std::min(begin, run.row_start_[i + 1]) - run.row_start_[i]));
        absl::MutexLock lock(&mu_);
        RequestState& state = requests_[plan.inputs[i].request_id];
        // Partly applied: a retry under the same call_id must not look like a replay.
        state.last_call_id.clear();
        state.last_input_digest.clear();
        DropRetained(state);
        state.kv_bytes = kv_bytes;
        state.length = length;
        state.last_position = plan.inputs[i].positions[state.length - 1 - plan.requests[i].length];
      }
    }
    return UndoPrefill(run, status);
  };
  // Sealed between two chunks only when a drain gave up waiting for this Forward (its deadline):
  // the run fails here, so no OK answers a request the drain did not move.
  if (absl::Status sealed = drain_seal_.Check(static_cast<int64_t>(plan.inputs.size()));
      !sealed.ok()) {
    return fail(sealed);
  }
  std::vector<PrefillChunk> pieces;
  absl::StatusOr<Tensor> chunk_out = absl::UnknownError("not run");
  const size_t row_bytes = static_cast<size_t>(spec_.d_model) * DTypeSize(run.dtype_);
  const auto start = std::chrono::steady_clock::now();
  try {
    for (size_t i = 0; i < plan.inputs.size(); ++i) {
      const int64_t lo = std::max(begin, run.row_start_[i]);
      const int64_t hi = std::min(end, run.row_start_[i + 1]);
      if (lo >= hi) continue;
      pieces.push_back({plan.requests[i].sequence, hi - lo});
    }
    // A chunk that is all of `source` (a whole unchunked Forward, a streamed chunk) runs from it;
    // a part of it is copied out (1 MiB for 512 rows of d_model 512 in f32).
    std::optional<Tensor> part;
    if (source_row != 0 || source.dim(0) != end - begin) {
      part.emplace(run.dtype_, std::vector<int64_t>{end - begin, spec_.d_model},
                   source.data() + static_cast<size_t>(source_row) * row_bytes);
    }
    const Tensor& rows = part.has_value() ? *part : source;
    // The chunk's pages draw on the sequences' reservation in the layer (StartPrefillRun).
    const absl::Span<const int64_t> chunk_positions = absl::MakeConstSpan(run.positions_).subspan(
        static_cast<size_t>(begin), static_cast<size_t>(end - begin));
    chunk_out = model_ != nullptr ? model_->PrefillLayer(plan.layer, pieces, rows, chunk_positions)
                                  : layer_->Prefill(pieces, rows, chunk_positions);
  } catch (const std::bad_alloc&) {
    // Handled as any failed chunk: earlier chunks are recorded, this one's sequences undone.
    chunk_out = OutOfMemoryError("this Forward");
  }
  run.compute_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - start)
                         .count();
  ++run.chunks_run_;
  if (!chunk_out.ok()) return fail(chunk_out.status());
  run.next_row_ = end;
  RefreshKvBytes();
  return chunk_out;
}

void Session::GiveBackReservation(PrefillRun& run) {
  if (!run.reserved_ || layer_ == nullptr) return;
  run.reserved_ = false;
  const int64_t none = 0;
  for (const StepPlan::Request& r : run.plan_.requests) {
    // One by one: a sequence released or dropped since cannot keep the others' back.
    layer_->ReserveKv({&r.sequence, 1}, {&none, 1}).IgnoreError();
  }
}

std::vector<StepOutput> Session::FinishPrefill(PrefillRun& run) {
  GiveBackReservation(run);  // Whatever a window's eviction left unused.
  {
    absl::MutexLock lock(&mu_);
    EndPrefillLocked(run);
  }
  run.over_ = true;
  return Commit(run.plan_, run.out_, 0, absl::Now(), std::move(run.results_));
}

absl::StatusOr<Session::RequestState*> Session::UseRequestLocked(const std::string& request_id) {
  last_used_ = absl::Now();
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("request_id: request '", ClipForMessage(request_id),
                                            "' not found in session '", id_, "'"));
  }
  return &it->second;
}

int64_t Session::RequestLength(const std::string& request_id) const {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  return it == requests_.end() ? 0 : it->second.length;
}

absl::StatusOr<ForkOutcome> Session::Fork(const std::string& source,
                                          const std::vector<std::string>& new_ids) {
  if (layer_ == nullptr || closed()) return SessionClosedError(id_);
  if (new_ids.empty()) {
    return absl::InvalidArgumentError("new_request_ids: must name at least one new request");
  }
  if (absl::Status s = drain_seal_.Check(static_cast<int64_t>(new_ids.size())); !s.ok()) return s;
  RequestState original;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<RequestState*> found = UseRequestLocked(source);
    if (!found.ok()) return found.status();
    original = **found;
    if (original.step_layer != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("request_id: request '", ClipForMessage(source),
                       "' is in mid-step (layers 0..", original.step_layer - 1, " of ", num_layers_,
                       " ran it); fork it after layer ", num_layers_ - 1, " of the step"));
    }
    absl::flat_hash_set<std::string> seen;
    for (size_t i = 0; i < new_ids.size(); ++i) {
      const std::string field = absl::StrCat("new_request_ids[", i, "]");
      if (new_ids[i].empty()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
      }
      if (!seen.insert(new_ids[i]).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": '", new_ids[i], "' appears more than once"));
      }
      // ALREADY_EXISTS, as ImportRequest answers for a taken id: the id is well formed, only taken.
      if (requests_.contains(new_ids[i])) {
        return absl::AlreadyExistsError(absl::StrCat(field, ": request '", new_ids[i],
                                                     "' already exists in session '", id_, "'"));
      }
    }
    if (static_cast<int64_t>(requests_.size()) + static_cast<int64_t>(new_ids.size()) >
        limits_.max_requests) {
      return absl::ResourceExhaustedError(
          absl::StrCat("session '", id_, "' has ", requests_.size(), " requests; ", new_ids.size(),
                       " forks would pass max_requests = ", limits_.max_requests,
                       " (release requests or raise the limit)"));
    }
  }
  const int64_t before = kv_bytes_used();
  absl::StatusOr<std::vector<SequenceId>> forks =
      layer_->ForkSequence(original.sequence, static_cast<int>(new_ids.size()));
  if (!forks.ok()) return forks.status();
  RefreshKvBytes();
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  // The forks' length as the layer counts it (the source's).
  const int64_t length = layer_->SequenceLength(forks->front()).value_or(original.length);
  for (size_t i = 0; i < new_ids.size(); ++i) {
    RequestState state = original;
    state.sequence = (*forks)[i];
    state.length = length;
    state.last_used = now;
    state.last_call_id.clear();  // A retry of the source's last call is not a call on a fork.
    state.last_input_digest.clear();
    state.last_output = RetainedOutputs::kNone;  // The source's, not the fork's.
    requests_.emplace(new_ids[i], std::move(state));
  }
  return ForkOutcome{length, kv_bytes_used() - before};
}

absl::StatusOr<int64_t> Session::ReleaseRequest(const std::string& request_id) {
  if (layer_ == nullptr || closed()) return SessionClosedError(id_);
  if (absl::Status s = drain_seal_.Check(1); !s.ok()) return s;
  SequenceId sequence;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<RequestState*> found = UseRequestLocked(request_id);
    if (!found.ok()) return found.status();
    sequence = (*found)->sequence;
    DropRetained(**found);
    requests_.erase(request_id);
  }
  const int64_t before = kv_bytes_used();
  if (absl::Status s = layer_->ReleaseSequence(sequence); !s.ok()) return s;
  RefreshKvBytes();
  return before - kv_bytes_used();
}

int64_t Session::Close() {
  MarkClosing();
  if (layer_ == nullptr) return 0;
  RefreshKvBytes();
  const int64_t freed = kv_bytes_used();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [request_id, state] : requests_) DropRetained(state);
    requests_.clear();
  }
  model_ = nullptr;
  layer_.reset();  // Credits every page still held back to the pool.
  parameters_ = ParameterCharge();
  kv_bytes_used_.store(0, std::memory_order_relaxed);
  // A layer's weights and KV slabs are many blocks of a MiB or so, below glibc's (adaptive) mmap
  // threshold: freed, they stay in malloc's arenas and the process's resident memory never comes
  // down. Hand the free pages back now, so RSS tracks what the sessions hold (a session's release
  // is rare next to its steps, and the trim costs ~a millisecond).
  malloc_trim(0);
  return freed;
}

int Session::ExpireRequests(absl::Time now, absl::Duration ttl) {
  // Sealed: the drain moves what it listed; a request expired here would still live there.
  if (layer_ == nullptr || drain_seal_.sealed()) return 0;
  std::vector<SequenceId> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = requests_.begin(); it != requests_.end();) {
      if (now - it->second.last_used > ttl && !in_prefill_.contains(it->first)) {
        expired.push_back(it->second.sequence);
        DropRetained(it->second);
        requests_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (SequenceId s : expired) layer_->ReleaseSequence(s).IgnoreError();
  if (!expired.empty()) RefreshKvBytes();
  return static_cast<int>(expired.size());
}

SessionSnapshot Session::Snapshot(absl::Time now, bool with_requests) const {
  SessionSnapshot snapshot;
  snapshot.id = id_;
  snapshot.label = label_;
  snapshot.spec = spec_;
  snapshot.kv_dtype = kv_dtype_;
  snapshot.kv_quantization = kv_storage_.quantization;
  snapshot.page_size = page_size_;
  snapshot.cost = cost_;
  snapshot.kv_bytes_used = kv_bytes_used();
  snapshot.batching = scheduler_->counters();
  snapshot.fingerprint = fingerprint_;
  snapshot.num_layers = num_layers_;
  snapshot.per_layer = per_layer_;
  if (stack_kv_ != nullptr) snapshot.kv_by_layer_kind = stack_kv_->Get();
  absl::MutexLock lock(&mu_);
  snapshot.idle = now - last_used_;
  if (!with_requests) return snapshot;
  for (const auto& [request_id, state] : requests_) {
    snapshot.requests.push_back(
        {request_id, state.length, state.kv_bytes, now - state.last_used, state.step_layer});
  }
  std::sort(snapshot.requests.begin(), snapshot.requests.end(),
            [](const RequestSnapshot& a, const RequestSnapshot& b) {
              return a.request_id < b.request_id;
            });
  return snapshot;
}

absl::Duration Session::IdleTime(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return now - last_used_;
}

int Session::num_requests() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(requests_.size());
}

}  // namespace attnserve::server

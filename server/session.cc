#include "server/session.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/spec_codec.h"
#include "server/tensor_codec.h"

namespace attnserve::server {

namespace {

absl::Status SessionClosedError(const std::string& id) {
  return absl::NotFoundError(absl::StrCat("session '", id, "' was released or expired"));
}

}  // namespace

Session::Session(std::string id, std::string label, const LayerSpec& spec, DType kv_dtype,
                 SessionLimits limits, std::unique_ptr<AttentionLayer> layer,
                 v1::SessionCost cost, Executor* executor)
    : id_(std::move(id)),
      label_(std::move(label)),
      spec_(spec),
      kv_dtype_(kv_dtype),
      limits_(limits),
      cost_(std::move(cost)),
      page_size_(layer->PoolUsage().page_size),
      page_bytes_(layer->PoolUsage().page_bytes),
      queue_(SerialQueue::Create(executor)),
      layer_(std::move(layer)),
      last_used_(absl::Now()) {}

int64_t Session::RequestKvBytes(int64_t length) const {
  int64_t pages = (length + page_size_ - 1) / page_size_;
  if (spec_.causal && spec_.sliding_window > 0) {
    const int64_t dead = std::max<int64_t>(0, (length - spec_.sliding_window + 1) / page_size_);
    pages -= std::min(pages, dead);
  }
  return pages * page_bytes_;
}

void Session::RefreshKvBytes() {
  const KvPoolUsage usage = layer_ != nullptr ? layer_->PoolUsage() : KvPoolUsage{};
  kv_bytes_used_.store(usage.used_pages * usage.page_bytes, std::memory_order_relaxed);
}

absl::StatusOr<std::vector<StepOutput>> Session::Step(std::vector<StepInput> inputs, bool decode,
                                                      int64_t* compute_ns) {
  *compute_ns = 0;
  if (layer_ == nullptr || closed()) return SessionClosedError(id_);
  if (inputs.empty()) return absl::InvalidArgumentError("items: must not be empty");
  const absl::Time now = absl::Now();

  // Plan: resolve each input's request and check positions and limits, changing nothing yet.
  struct Planned {
    SequenceId sequence = 0;
    bool is_new = false;
    int64_t length = 0;
  };
  std::vector<Planned> plan(inputs.size());
  bool explicit_positions = false;
  {
    absl::MutexLock lock(&mu_);
    last_used_ = now;
    int new_requests = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const StepInput& in = inputs[i];
      const int64_t rows = in.hidden.dim(0);
      int64_t length = 0;
      int64_t last_position = -1;
      auto it = requests_.find(in.request_id);
      if (it == requests_.end()) {
        if (decode) {
          return absl::NotFoundError(absl::StrCat(
              "items[", i, "].request_id: request '", in.request_id, "' not found in session '",
              id_, "' (create it with Forward; it may have been released or expired)"));
        }
        plan[i].is_new = true;
        ++new_requests;
      } else {
        plan[i].sequence = it->second.sequence;
        length = it->second.length;
        last_position = it->second.last_position;
      }
      plan[i].length = length;
      if (!in.positions.empty()) {
        explicit_positions = true;
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
          return absl::InvalidArgumentError(absl::StrCat(
              "items[", i, "].positions[0] = ", in.positions[0],
              ", must be after the last position (", last_position, ") of request '",
              in.request_id, "'"));
        }
      } else if (length <= last_position) {
        // Earlier explicit positions ran ahead of the length; implicit ones would go backwards.
        return absl::InvalidArgumentError(absl::StrCat(
            "items[", i, "].positions: empty means positions from the request's length ", length,
            ", which is not after the last position (", last_position, ") of request '",
            in.request_id, "'; give positions explicitly"));
      }
      if (length + rows > limits_.max_sequence_length) {
        return absl::OutOfRangeError(absl::StrCat(
            "items[", i, "]: request '", in.request_id, "' would hold ", length + rows,
            " tokens, over max_sequence_length = ", limits_.max_sequence_length));
      }
    }
    if (new_requests > 0 &&
        static_cast<int64_t>(requests_.size()) + new_requests > limits_.max_requests) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session '", id_, "' has ", requests_.size(), " requests; ", new_requests,
          " more would pass max_requests = ", limits_.max_requests,
          " (release requests or raise the limit)"));
    }
  }

  // Batch: concatenate rows (one dtype per call: the engine takes one tensor).
  const DType dtype = inputs[0].hidden.dtype();
  int64_t total_rows = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].hidden.dtype() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].hidden: dtype ", DTypeName(inputs[i].hidden.dtype()),
          " differs from items[0] (", DTypeName(dtype), "); one call takes one dtype"));
    }
    total_rows += inputs[i].hidden.dim(0);
  }
  Tensor hidden(dtype, {total_rows, spec_.d_model});
  std::vector<int64_t> positions;
  if (explicit_positions) positions.reserve(static_cast<size_t>(total_rows));
  {
    std::byte* dst = hidden.data();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& h = inputs[i].hidden;
      std::memcpy(dst, h.data(), h.num_bytes());
      dst += h.num_bytes();
      if (!explicit_positions) continue;
      if (inputs[i].positions.empty()) {
        // Same positions the engine would choose: continue from the length.
        for (int64_t t = 0; t < h.dim(0); ++t) positions.push_back(plan[i].length + t);
      } else {
        positions.insert(positions.end(), inputs[i].positions.begin(), inputs[i].positions.end());
      }
    }
  }

  for (Planned& p : plan) {
    if (p.is_new) p.sequence = layer_->CreateSequence();
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Tensor> out;
  if (decode) {
    std::vector<SequenceId> ids;
    for (const Planned& p : plan) ids.push_back(p.sequence);
    out = layer_->Decode(ids, hidden, positions);
  } else {
    std::vector<PrefillChunk> chunks;
    for (size_t i = 0; i < plan.size(); ++i) {
      chunks.push_back({plan[i].sequence, inputs[i].hidden.dim(0)});
    }
    out = layer_->Prefill(chunks, hidden, positions);
  }
  *compute_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - start)
                    .count();
  if (!out.ok()) {
    for (const Planned& p : plan) {
      if (p.is_new) layer_->ReleaseSequence(p.sequence).IgnoreError();
    }
    RefreshKvBytes();
    return out.status();
  }

  std::vector<StepOutput> results(inputs.size());
  {
    absl::MutexLock lock(&mu_);
    const std::byte* src = out->data();
    const size_t row_bytes = static_cast<size_t>(spec_.d_model) * DTypeSize(out->dtype());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int64_t rows = inputs[i].hidden.dim(0);
      RequestState& state = requests_[inputs[i].request_id];
      state.sequence = plan[i].sequence;
      state.length = plan[i].length + rows;
      state.last_position =
          inputs[i].positions.empty() ? state.length - 1 : inputs[i].positions.back();
      state.last_used = now;
      StepOutput& r = results[i];
      r.request_id = std::move(inputs[i].request_id);
      r.output = Tensor(out->dtype(), {rows, spec_.d_model});
      std::memcpy(r.output.data(), src, static_cast<size_t>(rows) * row_bytes);
      src += static_cast<size_t>(rows) * row_bytes;
      r.sequence_length = state.length;
    }
  }
  RefreshKvBytes();
  return results;
}

absl::StatusOr<int64_t> Session::ReleaseRequest(const std::string& request_id) {
  if (layer_ == nullptr || closed()) return SessionClosedError(id_);
  SequenceId sequence;
  {
    absl::MutexLock lock(&mu_);
    last_used_ = absl::Now();
    auto it = requests_.find(request_id);
    if (it == requests_.end()) {
      return absl::NotFoundError(absl::StrCat("request_id: request '", request_id,
                                              "' not found in session '", id_, "'"));
    }
    sequence = it->second.sequence;
    requests_.erase(it);
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
    requests_.clear();
  }
  layer_.reset();  // Credits every page still held back to the pool.
  kv_bytes_used_.store(0, std::memory_order_relaxed);
  return freed;
}

int Session::ExpireRequests(absl::Time now, absl::Duration ttl) {
  if (layer_ == nullptr) return 0;
  std::vector<SequenceId> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = requests_.begin(); it != requests_.end();) {
      if (now - it->second.last_used > ttl) {
        expired.push_back(it->second.sequence);
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

void Session::FillInfo(absl::Time now, bool with_requests, v1::SessionInfo* info) const {
  info->set_session_id(id_);
  info->set_label(label_);
  LayerSpecToProto(spec_, info->mutable_spec());
  info->set_kv_cache_dtype(DTypeToProto(kv_dtype_));
  info->set_page_size(static_cast<int32_t>(page_size_));
  *info->mutable_cost() = cost_;
  info->set_kv_bytes_used(kv_bytes_used());
  absl::MutexLock lock(&mu_);
  info->set_idle_ns(absl::ToInt64Nanoseconds(now - last_used_));
  if (!with_requests) return;
  std::vector<const std::pair<const std::string, RequestState>*> sorted;
  for (const auto& entry : requests_) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  for (const auto* entry : sorted) {
    const auto& [request_id, state] = *entry;
    v1::RequestInfo* r = info->add_requests();
    r->set_request_id(request_id);
    r->set_sequence_length(state.length);
    r->set_kv_bytes(RequestKvBytes(state.length));
    r->set_idle_ns(absl::ToInt64Nanoseconds(now - state.last_used));
  }
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

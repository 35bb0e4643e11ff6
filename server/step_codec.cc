#include "server/step_codec.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve::server {

namespace {

// Checks the request id of items[index] and that no earlier item used it.
absl::Status CheckRequestId(const std::string& id, int index,
                            absl::flat_hash_map<std::string, int>& seen) {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("items[", index, "].request_id: must not be empty"));
  }
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("items[", index, "].request_id: has ", id.size(),
                                                   " bytes, at most ", kMaxRequestIdBytes,
                                                   " allowed"));
  }
  auto [it, inserted] = seen.emplace(id, index);
  if (!inserted) {
    return absl::InvalidArgumentError(absl::StrCat("items[", index, "].request_id: '", id,
                                                   "' repeats items[", it->second,
                                                   "]; request ids in one call must be distinct"));
  }
  return absl::OkStatus();
}

absl::Status CheckWidth(const Tensor& hidden, const LayerSpec& spec, const std::string& field,
                        absl::string_view expected) {
  if (hidden.shape().back() != spec.d_model) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape ", ShapeString(hidden.shape()),
                                                   ", expected ", expected,
                                                   " (d_model = ", spec.d_model, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<StepInput>> ForwardInputsFromProto(const v1::ForwardRequest& request,
                                                              const LayerSpec& spec) {
  if (request.items_size() == 0) return absl::InvalidArgumentError("items: must not be empty");
  std::vector<StepInput> inputs(static_cast<size_t>(request.items_size()));
  absl::flat_hash_map<std::string, int> seen;
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::ForwardItem& item = request.items(i);
    if (absl::Status s = CheckRequestId(item.request_id(), i, seen); !s.ok()) return s;
    const std::string field = absl::StrCat("items[", i, "].hidden");
    absl::StatusOr<Tensor> hidden = TensorFromProto(item.hidden(), 2, field);
    if (!hidden.ok()) return hidden.status();
    if (absl::Status s = CheckWidth(*hidden, spec, field, "[num_tokens, d_model]"); !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckFinite(*hidden, field); !s.ok()) return s;
    if (item.positions_size() != 0 && item.positions_size() != hidden->dim(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "].positions: has ", item.positions_size(),
                       " entries, expected one per token (", hidden->dim(0), ") or none"));
    }
    inputs[i].request_id = item.request_id();
    inputs[i].hidden = *std::move(hidden);
    inputs[i].positions.assign(item.positions().begin(), item.positions().end());
  }
  return inputs;
}

absl::StatusOr<std::vector<StepInput>> DecodeInputsFromProto(const v1::DecodeRequest& request,
                                                             const LayerSpec& spec) {
  if (request.items_size() == 0) return absl::InvalidArgumentError("items: must not be empty");
  std::vector<StepInput> inputs(static_cast<size_t>(request.items_size()));
  absl::flat_hash_map<std::string, int> seen;
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::DecodeItem& item = request.items(i);
    if (absl::Status s = CheckRequestId(item.request_id(), i, seen); !s.ok()) return s;
    const std::string field = absl::StrCat("items[", i, "].hidden");
    absl::StatusOr<Tensor> hidden = TensorFromProto(item.hidden(), -1, field);
    if (!hidden.ok()) return hidden.status();
    const bool one_row = hidden->rank() == 1 || (hidden->rank() == 2 && hidden->dim(0) == 1);
    if (!one_row) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": shape ", ShapeString(hidden->shape()), ", expected [1, d_model] or [d_model]"));
    }
    if (absl::Status s = CheckWidth(*hidden, spec, field, "[1, d_model] or [d_model]"); !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckFinite(*hidden, field); !s.ok()) return s;
    if (hidden->rank() == 1) {
      // Same bytes as [1, d_model]; the engine takes rows.
      Tensor row(hidden->dtype(), {1, spec.d_model});
      std::copy(hidden->data(), hidden->data() + hidden->num_bytes(), row.data());
      hidden = std::move(row);
    }
    inputs[i].request_id = item.request_id();
    inputs[i].hidden = *std::move(hidden);
    if (item.has_position()) inputs[i].positions.push_back(item.position());
  }
  return inputs;
}

}  // namespace attnserve::server

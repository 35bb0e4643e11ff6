#include "server/rpc/step_codec.h"

#include <cstdint>
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
    if (absl::Status s = CheckMagnitude(*hidden, field, kMaxAbsHiddenValue); !s.ok()) return s;
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
    if (absl::Status s = CheckMagnitude(*hidden, field, kMaxAbsHiddenValue); !s.ok()) return s;
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

absl::Status CheckResponseFits(const std::vector<StepInput>& inputs, int64_t max_message_bytes) {
  // Every field but the output's bytes goes through the real encoder, with the widest value each
  // could take; the bytes field adds its tag, a length of at most 10 bytes, and the bytes.
  constexpr int64_t kTimingBound = 2 + 3 * 11;
  constexpr int64_t kBytesFieldOverhead = 1 + 10;
  int64_t total = kTimingBound;
  for (const StepInput& in : inputs) {
    v1::ForwardResult result;
    result.set_request_id(in.request_id);
    result.mutable_output()->set_dtype(DTypeToProto(in.hidden.dtype()));
    for (int64_t d : in.hidden.shape()) result.mutable_output()->add_shape(d);
    result.set_sequence_length(INT64_MAX);
    const int64_t output_bytes = static_cast<int64_t>(in.hidden.num_bytes());
    // The output Tensor's own length prefix grows with its bytes: bound it by 10 too.
    const int64_t result_bytes =
        static_cast<int64_t>(result.ByteSizeLong()) + kBytesFieldOverhead + 10 + output_bytes;
    total += 1 + 10 + result_bytes;  // The repeated field's tag and length.
  }
  if (total <= max_message_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the response would take up to ", total, " bytes, over the server's max_message_bytes = ",
      max_message_bytes, "; nothing was applied: send fewer tokens or items per call"));
}

}  // namespace attnserve::server

#include "server/rpc/step_codec.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve::server {

namespace {

absl::Status RepeatedRequestId(const std::string& id, int index, int first) {
  return absl::InvalidArgumentError(absl::StrCat("items[", index, "].request_id: '", id,
                                                 "' repeats items[", first,
                                                 "]; request ids in one call must be distinct"));
}

// Checks that a request id is non-empty and at most kMaxRequestIdBytes.
absl::Status CheckRequestIdLength(const std::string& id, int index) {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("items[", index, "].request_id: must not be empty"));
  }
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("items[", index, "].request_id: has ", id.size(),
                                                   " bytes, at most ", kMaxRequestIdBytes,
                                                   " allowed"));
  }
  return absl::OkStatus();
}

// Checks the request id of items[index] and that no earlier item used it.
absl::Status CheckRequestId(const std::string& id, int index,
                            absl::flat_hash_map<std::string, int>& seen) {
  if (absl::Status s = CheckRequestIdLength(id, index); !s.ok()) return s;
  auto [it, inserted] = seen.emplace(id, index);
  if (!inserted) return RepeatedRequestId(id, index, it->second);
  return absl::OkStatus();
}

absl::Status CheckWidth(const Tensor& hidden, const LayerSpec& spec, absl::string_view field,
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
  // Distinct ids through a sorted index kept per thread: a decode stream sends one call per layer
  // per step, and a hash map of the ids would be built (allocated) for each.
  thread_local std::vector<std::pair<absl::string_view, int>> by_id;
  by_id.clear();
  for (int i = 0; i < request.items_size(); ++i) by_id.emplace_back(request.items(i).request_id(), i);
  std::sort(by_id.begin(), by_id.end());
  // The first item (in item order) that repeats an earlier one, and that earlier one.
  int repeat = request.items_size(), first = -1;
  for (size_t k = 1; k < by_id.size(); ++k) {
    if (by_id[k].first == by_id[k - 1].first && by_id[k].second < repeat &&
        (k < 2 || by_id[k - 2].first != by_id[k].first)) {
      repeat = by_id[k].second;
      first = by_id[k - 1].second;
    }
  }
  char field_buffer[32];
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::DecodeItem& item = request.items(i);
    // In item order, as for Forward: the id's length, then whether an earlier item had it.
    if (absl::Status s = CheckRequestIdLength(item.request_id(), i); !s.ok()) return s;
    if (i == repeat) return RepeatedRequestId(item.request_id(), i, first);
    // "items[i].hidden" without a heap string for every item.
    const absl::string_view field(
        field_buffer, static_cast<size_t>(std::snprintf(field_buffer, sizeof(field_buffer),
                                                        "items[%d].hidden", i)));
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
  // The encoded size of each result, every field counted at the widest value it could take (the
  // same bound the encoder gives), computed rather than encoded: no message per item per call.
  // Every field number is below 16, so every tag is one byte.
  using google::protobuf::io::CodedOutputStream;
  constexpr int64_t kTimingBound = 2 + 3 * 11;
  constexpr int64_t kVarintBound = 10;
  int64_t total = kTimingBound;
  for (const StepInput& in : inputs) {
    int64_t shape_bytes = 0;
    for (int64_t d : in.hidden.shape()) {
      shape_bytes += CodedOutputStream::VarintSize64(static_cast<uint64_t>(d));
    }
    const int64_t output_bytes = static_cast<int64_t>(in.hidden.num_bytes());
    const int64_t tensor_bytes = (1 + kVarintBound) +                       // dtype
                                 (1 + kVarintBound + shape_bytes) +         // shape, packed
                                 (1 + kVarintBound + output_bytes);         // data
    const int64_t result_bytes =
        (1 + kVarintBound + static_cast<int64_t>(in.request_id.size())) +  // request_id
        (1 + kVarintBound + tensor_bytes) +                                 // output
        (1 + kVarintBound);                                                 // sequence_length
    total += 1 + kVarintBound + result_bytes;  // The repeated field's tag and length.
  }
  if (total <= max_message_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the response would take up to ", total, " bytes, over the server's max_message_bytes = ",
      max_message_bytes, "; nothing was applied: send fewer tokens or items per call"));
}

}  // namespace attnserve::server

#include "proto/codec/tensor_codec.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve {

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return DType::kF32;
    case v1::DTYPE_F16:
      return DType::kF16;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": dtype must be set (DTYPE_F32, DTYPE_F16 or DTYPE_BF16)"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown dtype value ", static_cast<int>(dtype)));
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_F32;
    case DType::kF16:
      return v1::DTYPE_F16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& proto, int expected_rank,
                                       absl::string_view field) {
  absl::StatusOr<DType> dtype = DTypeFromProto(proto.dtype(), field);
  if (!dtype.ok()) return dtype.status();
  if (expected_rank >= 0 && proto.shape_size() != expected_rank) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape has rank ", proto.shape_size(),
                                                   ", expected rank ", expected_rank));
  }
  if (proto.shape_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": shape must not be empty"));
  }
  std::vector<int64_t> shape(proto.shape().begin(), proto.shape().end());
  int64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": shape[", i, "] = ", shape[i], ", must be >= 1"));
    }
    // elements * shape[i] <= kMaxTensorElements, checked without overflowing.
    if (shape[i] > kMaxTensorElements / elements) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": shape ", ShapeString(shape), " has more than 2^40 elements"));
    }
    elements *= shape[i];
  }
  const int64_t expected_bytes = elements * static_cast<int64_t>(DTypeSize(*dtype));
  if (static_cast<int64_t>(proto.data().size()) != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": data has ", proto.data().size(), " bytes, expected ", expected_bytes,
                     " (", ShapeString(shape), " of ", DTypeName(*dtype), ")"));
  }
  return Tensor(*dtype, std::move(shape), reinterpret_cast<const std::byte*>(proto.data().data()));
}

void TensorToProto(const Tensor& tensor, v1::Tensor* proto) {
  proto->set_dtype(DTypeToProto(tensor.dtype()));
  proto->clear_shape();
  for (int64_t d : tensor.shape()) proto->add_shape(d);
  proto->set_data(reinterpret_cast<const char*>(tensor.data()), tensor.num_bytes());
}

absl::Status CheckFinite(const Tensor& tensor, absl::string_view field) {
  const int64_t bad = FirstNonFiniteElement(tensor);
  if (bad < 0) return absl::OkStatus();
  // Row-major multi-index of `bad`.
  std::vector<int64_t> index(tensor.shape().size());
  int64_t rest = bad;
  for (size_t axis = index.size(); axis-- > 0;) {
    index[axis] = rest % tensor.shape()[axis];
    rest /= tensor.shape()[axis];
  }
  float value = 0.0f;
  ConvertToFloat(tensor.dtype(),
                 tensor.data() + bad * static_cast<int64_t>(DTypeSize(tensor.dtype())), &value, 1);
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": element ", ShapeString(index), " is ",
      value != value ? "NaN" : (value > 0 ? "+Inf" : "-Inf"), "; inputs must be finite"));
}

absl::Status CheckMagnitude(const Tensor& tensor, absl::string_view field, float max_abs) {
  const float largest = MaxAbsValue(tensor);
  if (largest <= max_abs) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": holds a value of magnitude ", largest,
                                                 ", over the limit of ", max_abs));
}

}  // namespace attnserve

// Fuzzes the wire tensor codec (proto/codec/tensor_codec.h) with an attnserve.v1.Tensor parsed from
// the input, as every Forward, Decode and inline-weights Configure carries one.
//
// Properties: TensorFromProto returns a tensor or INVALID_ARGUMENT for every expected rank (never
// crashes, never allocates beyond the message's own data); an accepted tensor goes through
// TensorToProto and back bit-exactly; CheckFinite returns OK or INVALID_ARGUMENT.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/core/tensor.h"
#include "proto/codec/tensor_codec.h"
#include "tests/fuzz/fuzz_check.h"

namespace attnserve {
namespace {

void CheckRoundTrip(const Tensor& tensor, int expected_rank) {
  v1::Tensor encoded;
  TensorToProto(tensor, &encoded);
  absl::StatusOr<Tensor> decoded = TensorFromProto(encoded, expected_rank, "again");
  FUZZ_CHECK(decoded.ok(), decoded.status().ToString());
  FUZZ_CHECK(decoded->dtype() == tensor.dtype(), "dtype changed");
  FUZZ_CHECK(decoded->shape() == tensor.shape(), "shape changed");
  FUZZ_CHECK(decoded->num_bytes() == tensor.num_bytes() &&
                 std::memcmp(decoded->data(), tensor.data(), tensor.num_bytes()) == 0,
             "data changed");
}

}  // namespace
}  // namespace attnserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnserve;
  v1::Tensor proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;

  absl::StatusOr<DType> dtype = DTypeFromProto(proto.dtype());
  FUZZ_CHECK(dtype.ok() || dtype.status().code() == absl::StatusCode::kInvalidArgument,
             dtype.status().ToString());

  for (int expected_rank : {-1, 0, 1, 2, 3}) {
    absl::StatusOr<Tensor> tensor = TensorFromProto(proto, expected_rank, "items[0].hidden");
    if (!tensor.ok()) {
      FUZZ_CHECK(tensor.status().code() == absl::StatusCode::kInvalidArgument,
                 tensor.status().ToString());
      continue;
    }
    FUZZ_CHECK(tensor->num_bytes() == proto.data().size(), "tensor size differs from the data");
    absl::Status finite = CheckFinite(*tensor, "items[0].hidden");
    FUZZ_CHECK(finite.ok() || finite.code() == absl::StatusCode::kInvalidArgument,
               finite.ToString());
    CheckRoundTrip(*tensor, expected_rank);
  }
  return 0;
}

// Fuzzes attnctl's .npy reader (client/attnctl/npy.h), which reads hidden states from files users
// hand to the command-line client: the input is the whole file content, given to ParseNpy.
//
// Properties: ParseNpy returns a tensor or INVALID_ARGUMENT (never crashes, never allocates more
// than the input's own data); an accepted tensor holds exactly the bytes after the header, and its
// shape's element count times the dtype size equals that byte count.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/attnctl/npy.h"
#include "kernels/core/tensor.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnserve;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Tensor> tensor = ParseNpy(bytes);
  if (!tensor.ok()) {
    FUZZ_CHECK(tensor.status().code() == absl::StatusCode::kInvalidArgument,
               tensor.status().ToString());
    return 0;
  }
  FUZZ_CHECK(tensor->num_bytes() < size, "more data than the file");
  FUZZ_CHECK(tensor->num_bytes() ==
                 static_cast<size_t>(tensor->num_elements()) * DTypeSize(tensor->dtype()),
             ShapeString(tensor->shape()));
  return 0;
}

// A minimal reader and writer of NumPy's .npy format
// (https://numpy.org/devdocs/reference/generated/numpy.lib.format.html), enough for attnctl's
// hidden-state inputs and outputs:
//   "\x93NUMPY" major minor, a header length (uint16 for v1, uint32 for v2/v3), then a Python dict
//   literal {'descr': '<f4', 'fortran_order': False, 'shape': (4, 512), } padded with spaces and
//   a newline, then the raw row-major data.
// Read accepts little-endian float32 ('<f4') and float16 ('<f2'), C order only; any other descr,
// Fortran order, a truncated file or trailing bytes are INVALID_ARGUMENT naming the file. bfloat16
// has no standard .npy descr; use a safetensors file for bf16 inputs.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_NPY_H_
#define ATTNSERVE_CLIENT_ATTNCTL_NPY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/core/tensor.h"

namespace attnserve {

absl::StatusOr<Tensor> ReadNpy(const std::string& path);

// ReadNpy on the content of a file already in memory; errors do not name a file.
absl::StatusOr<Tensor> ParseNpy(absl::string_view bytes);

// Writes a version 1.0 file: '<f4' for F32, '<f2' for F16; BF16 is widened to '<f4' (exact).
absl::Status WriteNpy(const std::string& path, const Tensor& tensor);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNCTL_NPY_H_

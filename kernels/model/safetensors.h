// Reading and writing the safetensors checkpoint format
// (https://github.com/huggingface/safetensors).
//
// Layout of a file:
//   [8 bytes]  N, the header length, unsigned 64-bit little-endian
//   [N bytes]  a UTF-8 JSON object:
//                {"__metadata__": {"key": "value", ...},              (optional, strings only)
//                 "name": {"dtype": "BF16", "shape": [4096, 4096],
//                          "data_offsets": [begin, end]}, ...}
//   [rest]     the data region; each tensor's bytes are [begin, end) relative to its start,
//              dense, row-major, little-endian.
//
// The reader parses and validates the whole header when the file is opened, then reads one tensor
// at a time with pread, so loading one layer of a 100 GB checkpoint touches only that layer's
// bytes. Every header field is checked before it is trusted (the file may be truncated or hostile);
// errors use these codes:
//   NOT_FOUND         the file does not exist, cannot be opened or is not a regular file (FIFO,
//                     device, directory), or a tensor name does not exist.
//   DATA_LOSS         the file is shorter than its header says (truncated download or copy).
//   INVALID_ARGUMENT  the header is malformed: not JSON, wrong field types, begin > end, a byte
//                     size that disagrees with dtype x shape, negative dimensions, ...
//   UNIMPLEMENTED     Read() of a well-formed tensor whose dtype is not F32, F16 or BF16 (I64, F64,
//                     F8_E4M3, ...). Such tensors do not stop Open(): real checkpoints mix them in.
// No message ever quotes bytes of the file that were not parsed as its JSON header (the 8-byte
// length field of a file that is not a safetensors file is its first 8 bytes: /etc/shadow would
// show "root:*:1"), and paths and names are clipped (kernels/base/clip_for_message.h).
// Overlapping tensors and gaps in the data region are not rejected (the reference implementation
// rejects them, but they cannot make a read go out of bounds).
#ifndef ATTNSERVE_KERNELS_MODEL_SAFETENSORS_H_
#define ATTNSERVE_KERNELS_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/base/regular_file.h"
#include "kernels/core/tensor.h"

namespace attnserve {

// Header lengths above this are rejected before any allocation: real headers are a few MB even
// for checkpoints with ~100k tensors, and a corrupt length must not make us allocate gigabytes.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// One tensor's header entry.
struct SafetensorsTensorInfo {
  std::string dtype_name;      // As stored: "F32", "BF16", "I64", "F8_E4M3", ...
  std::optional<DType> dtype;  // Set when dtype_name is F32, F16 or BF16 (what Read() supports).
  std::vector<int64_t> shape;  // Every dimension >= 0; [] is a scalar.
  uint64_t data_begin = 0;     // Byte range [data_begin, data_end) relative to the data region.
  uint64_t data_end = 0;
};

// Converts a safetensors dtype name to ours: "F32" -> kF32, "F16" -> kF16, "BF16" -> kBF16.
// Any other name is UNIMPLEMENTED (known safetensors dtypes) or INVALID_ARGUMENT (unknown names).
absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view dtype_name);
// "F32", "F16", "BF16".
absl::string_view SafetensorsDTypeName(DType dtype);

class SafetensorsFile {
 public:
  // Opens `path` and validates its header. The file stays open (one descriptor) until this object
  // and all its moved-to copies are destroyed. Only a regular file is opened, without blocking
  // (a FIFO or a device is refused with NOT_FOUND, kernels/base/regular_file.h); kRefuse also
  // refuses a symlink as the last component (for paths already resolved,
  // kernels/base/path_confinement.h). Tensors whose data_offsets overlap are INVALID_ARGUMENT
  // naming both.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path,
                                              FinalSymlink final_symlink = FinalSymlink::kFollow);

  const std::string& path() const { return path_; }
  // Tensor names in sorted order ("__metadata__" is not a tensor and is not listed).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return tensors_.contains(name); }
  // The "__metadata__" object ({"format": "pt"} for files written by transformers).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // NOT_FOUND when the file has no tensor `name`.
  absl::StatusOr<SafetensorsTensorInfo> info(const std::string& name) const;

  // Reads tensor `name` from disk into a new Tensor in its stored dtype (bit-exact).
  // NOT_FOUND for an unknown name, UNIMPLEMENTED for a dtype other than F32/F16/BF16, DATA_LOSS
  // when the file has shrunk since Open().
  absl::StatusOr<Tensor> Read(const std::string& name) const;

 private:
  class Descriptor;  // Closes the file descriptor when the last owner goes away.

  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<const Descriptor> fd_;
  uint64_t data_start_ = 0;  // File offset of the data region: 8 + header length.
  std::map<std::string, SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` to `path` (replacing any existing file) in the layout above: tensors stored in
// name order, back to back, and the header padded with spaces so that the data region starts at a
// multiple of 8 bytes, as the reference implementation does. `metadata` becomes "__metadata__"
// (omitted when empty). INVALID_ARGUMENT for a tensor named "__metadata__" or a name or metadata
// string that is not valid UTF-8; INTERNAL naming the OS error when the file cannot be written.
absl::Status WriteSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_MODEL_SAFETENSORS_H_

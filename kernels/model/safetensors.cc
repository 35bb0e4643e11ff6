#include "kernels/model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/clip_for_message.h"
#include "kernels/base/regular_file.h"
#include "nlohmann/json.hpp"

namespace attnserve {

// The format stores little-endian data and we copy it into tensors byte for byte.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

class SafetensorsFile::Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() { close(fd_); }
  int get() const { return fd_; }

 private:
  int fd_;
};

namespace {

using json = nlohmann::json;

constexpr absl::string_view kMetadataKey = "__metadata__";

std::string ErrnoText(int error) { return std::strerror(error); }

// Size in bits of one element of each dtype the format defines (sub-byte float types included),
// or 0 for names it does not define.
int SafetensorsDTypeBits(absl::string_view name) {
  static constexpr std::pair<absl::string_view, int> kBits[] = {
      {"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},    {"BF16", 16},
      {"I32", 32},    {"U32", 32}, {"F32", 32}, {"F64", 64},    {"I64", 64},
      {"U64", 64},    {"C64", 64}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
  };
  for (const auto& [dtype, bits] : kBits) {
    if (dtype == name) return bits;
  }
  return 0;
}

// Reads exactly `size` bytes at `offset`, retrying short reads and EINTR. DATA_LOSS when the file
// ends first.
absl::Status PreadFully(int fd, void* buffer, size_t size, uint64_t offset, const std::string& path,
                        absl::string_view what) {
  auto* out = static_cast<char*>(buffer);
  while (size > 0) {
    const ssize_t n = pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("reading ", what, " from ", ClipForMessage(path), ": ", ErrnoText(errno)));
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat("reading ", what, " from ", ClipForMessage(path),
                       ": file ends early (truncated since it was opened?)"));
    }
    out += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// A JSON integer as uint64, or nullopt when it is not a non-negative integer.
std::optional<uint64_t> AsUnsigned(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(value.get<int64_t>());
  }
  return std::nullopt;
}

// Parses one tensor entry of the header. `data_size` is the length of the data region.
absl::StatusOr<SafetensorsTensorInfo> ParseTensorEntry(const std::string& path,
                                                       const std::string& name, const json& entry,
                                                       uint64_t data_size) {
  auto invalid = [&](absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat(
        ClipForMessage(path), ": header entry for tensor '", ClipForMessage(name), "' ", rule));
  };
  if (!entry.is_object()) return invalid("is not a JSON object");

  SafetensorsTensorInfo info;
  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return invalid("has no \"dtype\"");
  if (!dtype_it->is_string()) return invalid("has a \"dtype\" that is not a string");
  info.dtype_name = dtype_it->get<std::string>();
  if (absl::StatusOr<DType> dtype = DTypeFromSafetensors(info.dtype_name); dtype.ok()) {
    info.dtype = *dtype;
  }

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return invalid("has no \"shape\"");
  if (!shape_it->is_array()) return invalid("has a \"shape\" that is not an array");
  for (const json& dim : *shape_it) {
    if (!dim.is_number_integer()) {
      return invalid(absl::StrCat("has a non-integer dimension ", dim.dump(), " in \"shape\""));
    }
    if (dim.is_number_unsigned()
            ? dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
            : dim.get<int64_t>() < 0) {
      return invalid(absl::StrCat("has dimension ", dim.dump(),
                                  " in \"shape\"; dimensions must be in [0, 2^63)"));
    }
    info.shape.push_back(dim.get<int64_t>());
  }

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) return invalid("has no \"data_offsets\"");
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    return invalid("has \"data_offsets\" that is not an array [begin, end]");
  }
  const std::optional<uint64_t> begin = AsUnsigned((*offsets_it)[0]);
  const std::optional<uint64_t> end = AsUnsigned((*offsets_it)[1]);
  if (!begin || !end) return invalid("has \"data_offsets\" that are not non-negative integers");
  if (*begin > *end) {
    return invalid(absl::StrCat("has data_offsets [", *begin, ", ", *end, "] with begin > end"));
  }
  if (*end > data_size) {
    return absl::DataLossError(absl::StrCat(ClipForMessage(path), ": tensor '",
                                            ClipForMessage(name), "' has data_offsets [", *begin,
                                            ", ", *end, "] past the end of the data region (",
                                            data_size, " bytes); the file is truncated"));
  }
  info.data_begin = *begin;
  info.data_end = *end;

  // Counted in 128 bits and capped at 2^64 elements, so that no product of hostile dimensions
  // can wrap around to a plausible size.
  const int bits = SafetensorsDTypeBits(info.dtype_name);
  if (bits == 0) return info;  // Unknown dtype: range-checked above; Read() will refuse it.
  using u128 = unsigned __int128;
  constexpr u128 kCap = static_cast<u128>(1) << 64;
  u128 elements = 1;
  for (int64_t dim : info.shape) {
    if (dim == 0) {
      elements = 0;
      break;
    }
    if (elements <= kCap) elements *= static_cast<u128>(dim);  // < 2^64 * 2^63: no wrap.
  }
  const uint64_t byte_size = *end - *begin;
  const u128 needed_bits = elements * static_cast<u128>(bits);
  if (needed_bits != static_cast<u128>(byte_size) * 8) {
    const u128 needed_bytes = needed_bits / 8;
    const std::string needed = needed_bytes >= kCap
                                   ? std::string("2^64 bytes or more")
                                   : absl::StrCat(static_cast<uint64_t>(needed_bytes), " bytes");
    return invalid(absl::StrCat("has ", byte_size, " bytes of data but dtype ", info.dtype_name,
                                " and shape ", ShapeString(info.shape), " need ", needed));
  }
  return info;
}

// Each tensor's bytes are its own: two tensors whose data_offsets overlap alias each other, which
// no writer produces (safetensors' own loader refuses it) and which would let one tensor's bytes be
// read as another's. Empty tensors occupy no bytes and overlap nothing.
absl::Status CheckNoOverlap(absl::string_view shown,
                            const std::map<std::string, SafetensorsTensorInfo>& tensors) {
  std::vector<std::pair<const std::string*, const SafetensorsTensorInfo*>> by_begin;
  for (const auto& [name, info] : tensors) {
    if (info.data_end > info.data_begin) by_begin.emplace_back(&name, &info);
  }
  std::sort(by_begin.begin(), by_begin.end(), [](const auto& a, const auto& b) {
    return a.second->data_begin != b.second->data_begin
               ? a.second->data_begin < b.second->data_begin
               : *a.first < *b.first;
  });
  // Sorted by begin, a tensor overlaps an earlier one iff it begins before the furthest end so far.
  size_t furthest = 0;
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const SafetensorsTensorInfo& earlier = *by_begin[furthest].second;
    const SafetensorsTensorInfo& later = *by_begin[i].second;
    if (later.data_begin < earlier.data_end) {
      return absl::InvalidArgumentError(absl::StrCat(
          shown, ": tensors '", ClipForMessage(*by_begin[furthest].first), "' (data_offsets [",
          earlier.data_begin, ", ", earlier.data_end, "]) and '",
          ClipForMessage(*by_begin[i].first), "' (data_offsets [", later.data_begin, ", ",
          later.data_end, "]) overlap; each tensor's bytes must be its own"));
    }
    if (later.data_end > earlier.data_end) furthest = i;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view dtype_name) {
  if (dtype_name == "F32") return DType::kF32;
  if (dtype_name == "F16") return DType::kF16;
  if (dtype_name == "BF16") return DType::kBF16;
  if (SafetensorsDTypeBits(dtype_name) != 0) {
    return absl::UnimplementedError(absl::StrCat("safetensors dtype ", dtype_name,
                                                 " is not supported; only F32, F16 and BF16 are"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown safetensors dtype '", dtype_name, "'; expected F32, F16 or BF16"));
}

absl::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "unknown";
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path,
                                                      FinalSymlink final_symlink) {
  // Non-blocking and regular files only: a FIFO or a device named as a checkpoint would otherwise
  // block the calling thread forever (regular_file.h).
  absl::StatusOr<OpenedFile> opened = OpenRegularFile(path, final_symlink);
  if (!opened.ok()) return opened.status();
  auto fd = std::make_shared<const Descriptor>(opened->fd);
  const uint64_t file_size = opened->size;
  const std::string shown = ClipForMessage(path);
  if (file_size < 8) {
    return absl::DataLossError(absl::StrCat(shown, " is ", file_size,
                                            " bytes long; a safetensors file starts with an "
                                            "8-byte header length"));
  }

  unsigned char length_bytes[8];
  if (absl::Status s = PreadFully(fd->get(), length_bytes, 8, 0, path, "the header length");
      !s.ok()) {
    return s;
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length_bytes[i];
  // The messages below never print header_size: for a file that is not a safetensors file, those
  // are its first 8 bytes ("root:*:1" of /etc/shadow), and errors must not leak file contents.
  // Both limits are checked before the header buffer is allocated.
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown,
                     ": not a safetensors file (header length field out of range: it "
                     "exceeds the limit of ",
                     kMaxSafetensorsHeaderBytes, " bytes)"));
  }
  if (header_size > file_size - 8) {
    return absl::DataLossError(
        absl::StrCat(shown,
                     ": not a safetensors file, or a truncated one (the header length field "
                     "runs past the end of the ",
                     file_size, "-byte file)"));
  }

  std::string header(header_size, '\0');
  if (absl::Status s = PreadFully(fd->get(), header.data(), header.size(), 8, path, "the header");
      !s.ok()) {
    return s;
  }
  // Non-throwing parse: a malformed header becomes a discarded value, not an exception.
  const json root = json::parse(header, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": not a safetensors file (the header is not valid JSON)"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        shown, ": the header is JSON but not an object (it is ", root.type_name(), ")"));
  }

  SafetensorsFile file;
  file.path_ = path;
  file.fd_ = std::move(fd);
  file.data_start_ = 8 + header_size;
  const uint64_t data_size = file_size - file.data_start_;
  for (const auto& [name, entry] : root.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(shown, ": \"__metadata__\" is not a JSON object"));
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(shown, ": \"__metadata__\" value for '", ClipForMessage(key),
                           "' is not a string (it is ", value.type_name(), ")"));
        }
        file.metadata_.emplace(key, value.get<std::string>());
      }
      continue;
    }
    absl::StatusOr<SafetensorsTensorInfo> info = ParseTensorEntry(path, name, entry, data_size);
    if (!info.ok()) return info.status();
    file.tensors_.emplace(name, *std::move(info));
  }
  if (absl::Status s = CheckNoOverlap(shown, file.tensors_); !s.ok()) return s;
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

absl::StatusOr<SafetensorsTensorInfo> SafetensorsFile::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no tensor '", ClipForMessage(name), "' in ", ClipForMessage(path_)));
  }
  return it->second;
}

absl::StatusOr<Tensor> SafetensorsFile::Read(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no tensor '", ClipForMessage(name), "' in ", ClipForMessage(path_)));
  }
  const SafetensorsTensorInfo& info = it->second;
  if (!info.dtype.has_value()) {
    absl::Status why = DTypeFromSafetensors(info.dtype_name).status();
    return absl::Status(why.code(), absl::StrCat("tensor '", ClipForMessage(name), "' in ",
                                                 ClipForMessage(path_), ": ", why.message()));
  }
  // Open() checked that the byte range matches dtype x shape, so the buffer is exactly its size.
  Tensor tensor(*info.dtype, info.shape);
  if (absl::Status s =
          PreadFully(fd_->get(), tensor.data(), tensor.num_bytes(), data_start_ + info.data_begin,
                     path_, absl::StrCat("tensor '", ClipForMessage(name), "'"));
      !s.ok()) {
    return s;
  }
  return tensor;
}

absl::Status WriteSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps "__metadata__" first, as the reference writer does.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& meta = header[std::string(kMetadataKey)];
    meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey) {
      return absl::InvalidArgumentError(
          "WriteSafetensors: a tensor may not be named \"__metadata__\" (reserved by the format)");
    }
    const uint64_t end = offset + tensor.num_bytes();
    header[name] = {{"dtype", std::string(SafetensorsDTypeName(tensor.dtype()))},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    // dump() throws only for strings that are not valid UTF-8; names and metadata come from
    // callers, so this is their error, reported as a status rather than an escaping exception.
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteSafetensors: a tensor name or metadata string is not valid UTF-8 (", e.what(), ")"));
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);

  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("WriteSafetensors: opening ", path, " for writing: ", ErrnoText(errno)));
  }
  auto write_all = [fd](const void* data, size_t size) -> int {
    const auto* in = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = write(fd, in, size);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno;
      }
      in += n;
      size -= static_cast<size_t>(n);
    }
    return 0;
  };
  int error = write_all(prefix.data(), prefix.size());
  if (error == 0) error = write_all(text.data(), text.size());
  for (const auto& [name, tensor] : tensors) {
    if (error != 0) break;
    error = write_all(tensor.data(), tensor.num_bytes());
  }
  if (close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    return absl::InternalError(
        absl::StrCat("WriteSafetensors: writing ", path, ": ", ErrnoText(error)));
  }
  return absl::OkStatus();
}

}  // namespace attnserve

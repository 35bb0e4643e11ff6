#include "client/attnctl/npy.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace attnserve {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

// The value text of `key` in the header dict: for 'descr' the quoted string, for 'shape' the
// parenthesised tuple, for 'fortran_order' True/False.
absl::StatusOr<std::string> DictValue(absl::string_view header, absl::string_view key) {
  const std::string quoted = absl::StrCat("'", key, "'");
  size_t at = header.find(quoted);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("header has no ", quoted));
  }
  absl::string_view rest = header.substr(at + quoted.size());
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (!absl::ConsumePrefix(&rest, ":")) {
    return absl::InvalidArgumentError(absl::StrCat("header: no ':' after ", quoted));
  }
  rest = absl::StripLeadingAsciiWhitespace(rest);
  size_t end;
  if (absl::StartsWith(rest, "(")) {
    end = rest.find(')');
    if (end == absl::string_view::npos) return absl::InvalidArgumentError("header: unclosed tuple");
    return std::string(rest.substr(0, end + 1));
  }
  if (absl::StartsWith(rest, "'")) {
    end = rest.find('\'', 1);
    if (end == absl::string_view::npos)
      return absl::InvalidArgumentError("header: unclosed string");
    return std::string(rest.substr(1, end - 1));
  }
  end = rest.find_first_of(",}");
  return std::string(absl::StripAsciiWhitespace(rest.substr(0, end)));
}

}  // namespace

absl::StatusOr<Tensor> ParseNpy(absl::string_view bytes) {
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, kMagicLen) != 0) {
    return absl::InvalidArgumentError("not a .npy file (no \\x93NUMPY magic)");
  }
  const uint8_t major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_len =
        static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return absl::InvalidArgumentError("truncated header");
    for (int i = 0; i < 4; ++i) {
      header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    }
    header_start = 12;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unsupported .npy version ", major));
  }
  if (bytes.size() < header_start + header_len)
    return absl::InvalidArgumentError("truncated header");
  const absl::string_view header(bytes.data() + header_start, header_len);

  absl::StatusOr<std::string> descr = DictValue(header, "descr");
  if (!descr.ok()) return descr.status();
  DType dtype;
  if (*descr == "<f4") {
    dtype = DType::kF32;
  } else if (*descr == "<f2") {
    dtype = DType::kF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype '", *descr, "' is not supported (float32 '<f4' or float16 '<f2')"));
  }
  absl::StatusOr<std::string> fortran = DictValue(header, "fortran_order");
  if (!fortran.ok()) return fortran.status();
  if (*fortran != "False")
    return absl::InvalidArgumentError("Fortran-order arrays are not supported");
  absl::StatusOr<std::string> shape_text = DictValue(header, "shape");
  if (!shape_text.ok()) return shape_text.status();
  std::vector<int64_t> shape;
  absl::string_view inner = absl::StripSuffix(absl::StripPrefix(*shape_text, "("), ")");
  for (absl::string_view part : absl::StrSplit(inner, ',', absl::SkipWhitespace())) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad shape ", *shape_text));
    }
    shape.push_back(dim);
  }
  const size_t data_start = header_start + header_len;
  const size_t file_data_bytes = bytes.size() - data_start;
  // The product of the dimensions is checked against what the file holds as it grows, so that
  // hostile dimensions cannot overflow it (and wrap around to the file's size).
  const int64_t max_elements = static_cast<int64_t>(file_data_bytes / DTypeSize(dtype));
  int64_t elements = absl::c_linear_search(shape, 0) ? 0 : 1;
  for (int64_t dim : shape) {
    if (elements == 0) break;
    if (elements > max_elements / dim) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", *shape_text,
                                                     " needs more data than the file's ",
                                                     file_data_bytes, " bytes"));
    }
    elements *= dim;
  }
  const size_t data_bytes = static_cast<size_t>(elements) * DTypeSize(dtype);
  if (bytes.size() != data_start + data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", *shape_text, " needs ", data_bytes,
                                                   " data bytes, the file has ",
                                                   bytes.size() - data_start));
  }
  Tensor tensor(dtype, std::move(shape));
  if (data_bytes > 0) std::memcpy(tensor.data(), bytes.data() + data_start, data_bytes);
  return tensor;
}

absl::StatusOr<Tensor> ReadNpy(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  absl::StatusOr<Tensor> tensor = ParseNpy(bytes);
  if (!tensor.ok()) {
    return absl::Status(tensor.status().code(),
                        absl::StrCat(path, ": ", tensor.status().message()));
  }
  return tensor;
}

absl::Status WriteNpy(const std::string& path, const Tensor& input) {
  const Tensor tensor = input.dtype() == DType::kBF16 ? input.CastTo(DType::kF32) : input;
  std::vector<std::string> dims;
  for (int64_t dim : tensor.shape()) dims.push_back(absl::StrCat(dim));
  std::string shape = absl::StrJoin(dims, ", ");
  if (dims.size() == 1) shape += ",";
  std::string header = absl::StrCat("{'descr': '", tensor.dtype() == DType::kF16 ? "<f2" : "<f4",
                                    "', 'fortran_order': False, 'shape': (", shape, "), }");
  // Pad so that magic + version + length + header + '\n' is a multiple of 64 bytes.
  const size_t unpadded = kMagicLen + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return absl::InternalError(absl::StrCat(path, ": cannot open for writing"));
  file.write(kMagic, kMagicLen);
  const char version[2] = {1, 0};
  file.write(version, 2);
  const char len[2] = {static_cast<char>(header.size() & 0xff),
                       static_cast<char>((header.size() >> 8) & 0xff)};
  file.write(len, 2);
  file.write(header.data(), static_cast<std::streamsize>(header.size()));
  file.write(reinterpret_cast<const char*>(tensor.data()),
             static_cast<std::streamsize>(tensor.num_bytes()));
  if (!file) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace attnserve

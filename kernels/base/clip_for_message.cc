#include "kernels/base/clip_for_message.h"

#include "absl/strings/str_cat.h"

namespace attnserve {

std::string ClipForMessage(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t keep = max_bytes;
  // Do not split a multi-byte UTF-8 character: back up over continuation bytes (10xxxxxx).
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  return absl::StrCat(text.substr(0, keep), "...(", text.size(), " bytes)");
}

}  // namespace attnserve

// Client-supplied strings (ids, paths, labels) echoed into status messages are clipped, so a
// 1 MiB id cannot turn an error into a confusing metadata-size failure or flood a log.
#ifndef ATTNSERVE_SERVER_CLIP_FOR_MESSAGE_H_
#define ATTNSERVE_SERVER_CLIP_FOR_MESSAGE_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace attnserve::server {

inline constexpr size_t kMaxEchoedBytes = 200;

// `text` itself when at most `max_bytes` long; else its first `max_bytes` bytes followed by
// "...(N bytes)". Cuts on a byte boundary: the status message is bytes, not UTF-8.
inline std::string ClipForMessage(absl::string_view text, size_t max_bytes = kMaxEchoedBytes) {
  if (text.size() <= max_bytes) return std::string(text);
  return absl::StrCat(text.substr(0, max_bytes), "...(", text.size(), " bytes)");
}

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CLIP_FOR_MESSAGE_H_

// Clipping client-supplied strings (paths, ids, labels) before they are echoed in a status message
// or a log line.
//
// A message that repeats a 1 MiB id or path verbatim turns into a confusing metadata-size error at
// the transport and floods logs, so every client string that a message quotes goes through
// ClipForMessage: strings up to `max_bytes` come back unchanged; longer ones keep their first
// `max_bytes` bytes (cut back to a UTF-8 character boundary) followed by "...(N bytes)", N being
// the original length.
#ifndef ATTNSERVE_KERNELS_BASE_CLIP_FOR_MESSAGE_H_
#define ATTNSERVE_KERNELS_BASE_CLIP_FOR_MESSAGE_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace attnserve {

inline constexpr size_t kMaxEchoedBytes = 200;

// "abc" -> "abc"; a 1000-byte string -> its first 200 bytes + "...(1000 bytes)".
std::string ClipForMessage(absl::string_view text, size_t max_bytes = kMaxEchoedBytes);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_BASE_CLIP_FOR_MESSAGE_H_

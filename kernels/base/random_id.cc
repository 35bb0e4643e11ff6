#include "kernels/base/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"

namespace attnserve {

std::string RandomHexId128() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // No getrandom (very old kernel): /dev/urandom is the same generator. Without either there is
    // no safe id to give, and retrying forever would hang the caller.
    FILE* urandom = std::fopen("/dev/urandom", "rb");
    const size_t read =
        urandom == nullptr ? 0 : std::fread(bytes + got, 1, sizeof(bytes) - got, urandom);
    if (urandom != nullptr) std::fclose(urandom);
    if (read == 0) std::abort();
    got += read;
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

}  // namespace attnserve

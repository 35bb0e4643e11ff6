// Opening a file that must be a regular file, without ever blocking.
//
// open() of a FIFO blocks until a writer appears, and a character device (/dev/zero) reads
// forever, so a path that a client names must not be opened the ordinary way: OpenRegularFile
// opens with O_NONBLOCK (a FIFO opens at once for reading), checks with fstat() on the opened
// descriptor (so a file swapped after a stat() cannot slip through) and refuses anything that is
// not a regular file. O_NONBLOCK is left set: it has no effect on reads of regular files.
#ifndef ATTNSERVE_KERNELS_BASE_REGULAR_FILE_H_
#define ATTNSERVE_KERNELS_BASE_REGULAR_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace attnserve {

// Whether a symlink as the last component of the path is followed. kRefuse (O_NOFOLLOW) is for
// paths already resolved with realpath(): a symlink there was swapped in after the resolution.
enum class FinalSymlink { kFollow, kRefuse };

struct OpenedFile {
  int fd = -1;        // Owned by the caller, who must close() it.
  uint64_t size = 0;  // st_size at open.
};

// NOT_FOUND for every failure (missing, permission, symlink refused, FIFO, device, directory,
// socket), naming the path (clipped, kernels/base/clip_for_message.h) and the reason; never reads a
// byte of the file.
absl::StatusOr<OpenedFile> OpenRegularFile(const std::string& path,
                                           FinalSymlink final_symlink = FinalSymlink::kFollow);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_BASE_REGULAR_FILE_H_

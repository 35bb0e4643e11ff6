#include "kernels/base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/base/clip_for_message.h"

namespace attnserve {

namespace {

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::Status NotReadable(const std::string& path, absl::string_view why) {
  return absl::NotFoundError(
      absl::StrCat("'", ClipForMessage(path), "' is not a readable regular file (", why, ")"));
}

}  // namespace

absl::StatusOr<OpenedFile> OpenRegularFile(const std::string& path, FinalSymlink final_symlink) {
  int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC;
  if (final_symlink == FinalSymlink::kRefuse) flags |= O_NOFOLLOW;
  int fd = -1;
  do {
    fd = open(path.c_str(), flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int error = errno;
    return NotReadable(path, error == ELOOP && final_symlink == FinalSymlink::kRefuse
                                 ? "a symlink"
                                 : std::strerror(error));
  }
  struct stat info;
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return NotReadable(path, std::strerror(error));
  }
  if (!S_ISREG(info.st_mode)) {
    close(fd);
    return NotReadable(path, FileTypeName(info.st_mode));
  }
  return OpenedFile{fd, static_cast<uint64_t>(info.st_size)};
}

}  // namespace attnserve

// Confining paths that clients name to one directory tree (the server's --checkpoint_root).
//
// ResolveInsideRoot resolves a path with realpath() - every symlink followed, "." and ".."
// collapsed - and accepts it only when the result is realpath(root) or lies below it. A symlink
// inside the root that leads out of it is judged by where it leads, and refused.
//
// It answers nullopt for every refusal (missing, a component that cannot be searched, a symlink
// loop, outside the root, an unusable root) without saying which, so that callers can give one
// answer for all of them and a client cannot learn which paths exist outside the root.
//
// The resolved path has no symlinks; open it with O_NOFOLLOW (FinalSymlink::kRefuse in
// regular_file.h) so that a symlink swapped in for its last component afterwards is refused. A
// directory on the path being replaced between the check and the open is not guarded against:
// that needs write access inside the root, which only the server's operators have.
#ifndef ATTNSERVE_KERNELS_BASE_PATH_CONFINEMENT_H_
#define ATTNSERVE_KERNELS_BASE_PATH_CONFINEMENT_H_

#include <optional>
#include <string>

namespace attnserve {

// `path` may be absolute, or relative to `root`. `root` must be non-empty.
std::optional<std::string> ResolveInsideRoot(const std::string& root, const std::string& path);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_BASE_PATH_CONFINEMENT_H_

#include "kernels/base/path_confinement.h"

#include <limits.h>
#include <stdlib.h>

#include <memory>

namespace attnserve {

namespace {

std::optional<std::string> RealPath(const std::string& path) {
  // realpath(path, nullptr) allocates the result; PATH_MAX bounds it on Linux.
  std::unique_ptr<char, decltype(&free)> resolved(realpath(path.c_str(), nullptr), &free);
  if (resolved == nullptr) return std::nullopt;
  return std::string(resolved.get());
}

}  // namespace

std::optional<std::string> ResolveInsideRoot(const std::string& root, const std::string& path) {
  if (root.empty() || path.empty() || path.find('\0') != std::string::npos) return std::nullopt;
  const std::optional<std::string> real_root = RealPath(root);
  if (!real_root.has_value()) return std::nullopt;
  const std::string joined = path.front() == '/' ? path : *real_root + "/" + path;
  std::optional<std::string> resolved = RealPath(joined);
  if (!resolved.has_value()) return std::nullopt;
  if (*resolved == *real_root) return resolved;
  // Below the root: the root followed by a separator ("/data" must not admit "/database").
  const std::string prefix = *real_root == "/" ? "/" : *real_root + "/";
  if (resolved->compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  return resolved;
}

}  // namespace attnserve

// What this binary was built from: version, git revision, build type and backends, as --version
// prints them. The values are fixed when CMake configures the build (kernels/CMakeLists.txt).
#ifndef ATTNSERVE_KERNELS_BASE_BUILD_INFO_H_
#define ATTNSERVE_KERNELS_BASE_BUILD_INFO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace attnserve {

struct BuildInfo {
  absl::string_view version;       // PROJECT_VERSION, e.g. "0.1.0".
  absl::string_view git_revision;  // `git rev-parse --short HEAD` at configure time, or "unknown".
  absl::string_view build_type;    // CMAKE_BUILD_TYPE, e.g. "Release".
  absl::string_view backends;      // Compiled in: "cpu" or "cpu,cuda".
};

const BuildInfo& GetBuildInfo();

// "attnserve_server 0.1.0 (git 1a2b3c4, Release build, backends: cpu)".
std::string VersionLine(absl::string_view program);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_BASE_BUILD_INFO_H_

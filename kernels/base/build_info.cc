#include "kernels/base/build_info.h"

#include "absl/strings/str_cat.h"

namespace attnserve {

const BuildInfo& GetBuildInfo() {
  static constexpr BuildInfo kInfo{ATTNSERVE_VERSION, ATTNSERVE_GIT_REVISION,
                                   ATTNSERVE_BUILD_TYPE, ATTNSERVE_BACKENDS};
  return kInfo;
}

std::string VersionLine(absl::string_view program) {
  const BuildInfo& info = GetBuildInfo();
  return absl::StrCat(program, " ", info.version, " (git ", info.git_revision, ", ",
                      info.build_type.empty() ? "unknown" : info.build_type,
                      " build, backends: ", info.backends, ")");
}

}  // namespace attnserve

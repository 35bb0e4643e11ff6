#include "kernels/base/command_line_usage.h"

#include <utility>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "kernels/base/build_info.h"

namespace attnserve {

void SetCommandLineUsage(absl::string_view program, absl::string_view usage,
                         std::vector<std::string> flag_sources) {
  absl::SetProgramUsageMessage(usage);
  // The file names Abseil passes are __FILE__ of each flag's definition: absolute, or relative to
  // the build directory when ccache rewrites paths (base_dir), so a path fragment is matched.
  auto own_flag = [sources = std::move(flag_sources)](absl::string_view file) {
    for (const std::string& source : sources) {
      if (absl::StrContains(file, source)) return true;
    }
    return false;
  };
  absl::FlagsUsageConfig config;
  config.contains_help_flags = own_flag;
  config.contains_helpshort_flags = own_flag;
  // "Flags from server/main.cc", not from "../../server/main.cc" or "work/src/server/main.cc"
  // (Abseil's default only drops leading slashes).
  config.normalize_filename = [](absl::string_view file) {
    while (absl::ConsumePrefix(&file, "../") || absl::ConsumePrefix(&file, "./") ||
           absl::ConsumePrefix(&file, "/")) {
    }
    return std::string(file);
  };
  config.version_string = [line = VersionLine(program)] { return line + "\n"; };
  absl::SetFlagsUsageConfig(std::move(config));
}

}  // namespace attnserve

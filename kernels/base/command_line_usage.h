// --help and --version of attnserve's binaries.
//
// Abseil's default --help lists only flags defined in a file named after the program
// (attnserve_server.cc, ...), so with the flags in server/main.cc and client/<tool>/*.cc it printed
// "No flags matched"; its default --version printed only whether NDEBUG was defined, which for a
// Release build against Debian's Abseil read "Debug build". SetCommandLineUsage replaces both.
#ifndef ATTNSERVE_KERNELS_BASE_COMMAND_LINE_USAGE_H_
#define ATTNSERVE_KERNELS_BASE_COMMAND_LINE_USAGE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace attnserve {

// Call before absl::ParseCommandLine. --help and --helpshort list the flags defined in source files
// whose path contains one of `flag_sources` (e.g. "server/main.cc", "client/attnctl/");
// --version prints VersionLine(program) (kernels/base/build_info.h).
void SetCommandLineUsage(absl::string_view program, absl::string_view usage,
                         std::vector<std::string> flag_sources);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_BASE_COMMAND_LINE_USAGE_H_

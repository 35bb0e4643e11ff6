// The one child-process spawner of the process-level tests (server_process.h, balancer_process.h):
// a private temporary directory, and a program started there with its stdout and stderr in a log
// file and stdin on /dev/null.
#ifndef ATTNSERVE_TESTS_SUPPORT_CHILD_PROCESS_H_
#define ATTNSERVE_TESTS_SUPPORT_CHILD_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnserve::server_test {

// A fresh directory <temp>/<prefix>.XXXXXX (mkdtemp).
absl::StatusOr<std::string> MakeTempDir(absl::string_view prefix);

// Removes `dir` and everything in it (files a test chmod-ed included); errors are ignored.
void RemoveTempDir(const std::string& dir);

// Resource limits set in the child process between fork and exec (setrlimit, soft and hard
// alike); unset = inherited.
struct ProcessLimits {
  std::optional<uint64_t> address_space_bytes;  // RLIMIT_AS.
  std::optional<uint64_t> open_files;           // RLIMIT_NOFILE.
};

// Starts `args` (args[0] is the executable's path) with `envp` (null: this process's
// environment, with OPENBLAS_CORETYPE set to the core this process runs unless it is set, so a
// server computes as the engine in the test's own process does; kernels/cpu/blas_core.h), stdout and stderr to `log_path` (truncated), stdin from /dev/null: posix_spawn, or
// fork + exec when `limits` sets any (the child then holds no other descriptor). INTERNAL
// "posix_spawn <path>: <error>" (or "fork: <error>") when it cannot be started.
absl::StatusOr<pid_t> SpawnLogged(std::vector<std::string> args, const std::string& log_path,
                                  char* const* envp = nullptr, const ProcessLimits& limits = {});

}  // namespace attnserve::server_test

#endif  // ATTNSERVE_TESTS_SUPPORT_CHILD_PROCESS_H_

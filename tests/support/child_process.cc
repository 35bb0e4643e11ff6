#include "tests/support/child_process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/blas_core.h"

extern char** environ;

namespace attnserve::server_test {

absl::StatusOr<std::string> MakeTempDir(absl::string_view prefix) {
  std::string dir_template =
      (std::filesystem::temp_directory_path() / absl::StrCat(prefix, ".XXXXXX")).string();
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  return dir_template;
}

void RemoveTempDir(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ignored;
  // Tests may chmod files in here; make them removable first.
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ignored);
  std::filesystem::remove_all(dir, ignored);
}

absl::StatusOr<pid_t> SpawnLogged(std::vector<std::string> args, const std::string& log_path,
                                  char* const* envp, const ProcessLimits& limits) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  // This process's environment, with OpenBLAS's core pinned to the one this process runs: a
  // server re-executes itself with better kernels than an unrecognised CPU gets (blas_core.h),
  // and the tests compare its answers bit for bit with the engine run in the test's own process.
  std::vector<std::string> inherited;
  std::vector<char*> pinned;
  if (envp == nullptr) {
    for (char** e = environ; *e != nullptr; ++e) inherited.emplace_back(*e);
    if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
      inherited.push_back(absl::StrCat("OPENBLAS_CORETYPE=", BlasCoreName()));
    }
    for (std::string& e : inherited) pinned.push_back(e.data());
    pinned.push_back(nullptr);
    envp = pinned.data();
  }
  if (limits.address_space_bytes.has_value() || limits.open_files.has_value()) {
    // fork + exec, with setrlimit between them (posix_spawn cannot set limits). Only
    // async-signal-safe calls in the child.
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    if (pid == 0) {
      if (limits.address_space_bytes.has_value()) {
        const rlimit as{*limits.address_space_bytes, *limits.address_space_bytes};
        if (setrlimit(RLIMIT_AS, &as) != 0) _exit(126);
      }
      if (limits.open_files.has_value()) {
        const rlimit nofile{*limits.open_files, *limits.open_files};
        if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) _exit(126);
      }
      const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int null = open("/dev/null", O_RDONLY);
      if (log < 0 || null < 0) _exit(126);
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
      dup2(null, STDIN_FILENO);
      // Descriptors the test holds (sockets, other files) must not count against the limit.
      for (int fd = 3; fd < 4096; ++fd) close(fd);
      execve(argv[0], argv.data(), envp);
      _exit(127);
    }
    return pid;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  const int spawn_error = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_error != 0) {
    return absl::InternalError(
        absl::StrCat("posix_spawn ", argv[0], ": ", std::strerror(spawn_error)));
  }
  return pid;
}

}  // namespace attnserve::server_test

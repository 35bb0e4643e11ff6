// The real attnserve_server binary as a child process of a test: started on 127.0.0.1 with an
// ephemeral port, waited for (port file, then health SERVING), and stopped with SIGTERM (SIGKILL
// after a bound). Every wait here is bounded; nothing blocks forever.
#ifndef ATTNSERVE_TESTS_SUPPORT_SERVER_PROCESS_H_
#define ATTNSERVE_TESTS_SUPPORT_SERVER_PROCESS_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/support/child_process.h"  // ProcessLimits

namespace attnserve::server_test {

// The binary under test: ATTNSERVE_SERVER_BINARY ($<TARGET_FILE:attnserve_server>, a compile
// definition), or the environment variable of the same name when set.
std::string ServerBinaryPath();

// How a child process ended: exited(code) or killed by signal.
struct ExitState {
  bool exited = false;
  int exit_code = -1;  // Valid when exited.
  int signal = 0;      // Valid when !exited.
  std::string ToString() const;
};

class ServerProcess {
 public:
  // Starts the server with --listen=127.0.0.1:0 --port_file=<tmp> plus `flags`, then waits (at
  // most `startup_timeout`) for the port file and for grpc.health.v1 Check("") == SERVING.
  // The server's stdout and stderr go to a log file whose tail LogTail() returns.
  // `credentials` (plaintext when null) are those of the health check and of NewChannel(), for a
  // server started with TLS flags. `host` replaces 127.0.0.1 in --listen and address() (an IPv6
  // one in brackets: "[::1]").
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::vector<std::string>& flags,
      std::chrono::milliseconds startup_timeout = std::chrono::seconds(30),
      std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
      const std::string& host = "127.0.0.1");
  // As above, with `limits` applied to the child (a memory- or descriptor-starved server).
  static absl::StatusOr<std::unique_ptr<ServerProcess>> StartWithLimits(
      const std::vector<std::string>& flags, const ProcessLimits& limits,
      std::chrono::milliseconds startup_timeout = std::chrono::seconds(30));

  // SIGKILLs the process if it is still running and removes the temporary directory.
  ~ServerProcess();

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  // A directory the test may use for its own files; removed with the process object.
  const std::string& temp_dir() const { return temp_dir_; }

  // A new channel to the server. Receive limit 256 MiB so that the server's limits, not the
  // client's, are what tests observe.
  std::shared_ptr<grpc::Channel> NewChannel() const;

  // Sends SIGTERM and waits at most `timeout` for the process to exit. On timeout, SIGKILLs it
  // and returns DEADLINE_EXCEEDED.
  absl::StatusOr<ExitState> Terminate(std::chrono::milliseconds timeout);
  // Sends `signal` without waiting.
  void Signal(int signal) const;
  // The exit state if the process has ended (reaps it), nullopt while it runs.
  std::optional<ExitState> TryWait();

  // Resident set size from /proc/<pid>/status (VmRSS), in bytes; -1 if unreadable.
  int64_t ResidentBytes() const;
  // The most it has been since the process started (VmHWM), in bytes; -1 if unreadable.
  int64_t PeakResidentBytes() const;

  // The last `max_bytes` of the server's combined stdout/stderr.
  std::string LogTail(size_t max_bytes = 4000) const;

 private:
  ServerProcess() = default;
  static absl::StatusOr<std::unique_ptr<ServerProcess>> StartImpl(
      const std::vector<std::string>& flags, std::chrono::milliseconds startup_timeout,
      std::shared_ptr<grpc::ChannelCredentials> credentials, const std::string& host,
      const ProcessLimits& limits);

  pid_t pid_ = -1;
  bool reaped_ = false;
  ExitState exit_state_;
  int port_ = 0;
  std::string host_ = "127.0.0.1";
  std::string temp_dir_;
  std::string log_path_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
};

// grpc.health.v1 Check(service) with a deadline. Returns the ServingStatus enum value
// (1 = SERVING) or the RPC's error.
absl::StatusOr<int> HealthCheck(grpc::Channel& channel, const std::string& service,
                                std::chrono::milliseconds timeout);

// Names of the services that server reflection (v1alpha) lists.
absl::StatusOr<std::vector<std::string>> ReflectionListServices(grpc::Channel& channel,
                                                                std::chrono::milliseconds timeout);

// Serialized FileDescriptorProtos returned by reflection for `symbol`.
absl::StatusOr<std::vector<std::string>> ReflectionFileContainingSymbol(
    grpc::Channel& channel, const std::string& symbol, std::chrono::milliseconds timeout);

}  // namespace attnserve::server_test

#endif  // ATTNSERVE_TESTS_SUPPORT_SERVER_PROCESS_H_

// HAProxy, the real balancer of deploy/haproxy/haproxy.cfg, as a child process of a test: that
// very file, with its listen, metrics and replica addresses given by the environment variables it
// reads, on 127.0.0.1 ports the test does not need to know in advance. Every wait is bounded.
#ifndef ATTNSERVE_TESTS_SUPPORT_BALANCER_PROCESS_H_
#define ATTNSERVE_TESTS_SUPPORT_BALANCER_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace attnserve::scale_test {

// The haproxy executable (ATTNSERVE_HAPROXY_BINARY, found by CMake; the environment variable of
// the same name overrides it) and the configuration under test (ATTNSERVE_HAPROXY_CONFIG).
std::string HaproxyBinaryPath();
std::string HaproxyConfigPath();

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
absl::StatusOr<int> PickFreePort();

class BalancerProcess {
 public:
  // Starts haproxy -db -f <config> with ATTNSERVE_REPLICA_<i> = replicas[i] (host:port) and fresh
  // listen and metrics ports, and waits (at most `timeout`) until the listen port accepts TCP.
  // Replicas are not waited for: HealthyServers() says which the balancer counts as UP.
  // `listen_port` > 0 listens there instead (replicas started first may need the address).
  static absl::StatusOr<std::unique_ptr<BalancerProcess>> Start(
      const std::vector<std::string>& replicas,
      std::chrono::milliseconds timeout = std::chrono::seconds(20), int listen_port = 0);
  ~BalancerProcess();  // SIGTERM, a bounded wait, then SIGKILL; removes the temporary directory.

  BalancerProcess(const BalancerProcess&) = delete;
  BalancerProcess& operator=(const BalancerProcess&) = delete;

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // The backend servers' states from HAProxy's own stats (CSV at /stats;csv on the metrics port):
  // server name ("replica-0") -> status ("UP", "DOWN", "UP 1/2", ...) and the last check's
  // outcome, e.g. "L7OK" or "L7TOUT" (docs: HAProxy management guide, "CSV format").
  struct ServerState {
    std::string status;
    std::string check_status;
  };
  absl::StatusOr<std::map<std::string, ServerState>> ServerStates() const;

  // The last `max_bytes` of haproxy's output (health-check transitions are logged there).
  std::string LogTail(size_t max_bytes = 4000) const;

 private:
  BalancerProcess() = default;

  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
  std::string temp_dir_;
  std::string log_path_;
};

}  // namespace attnserve::scale_test

#endif  // ATTNSERVE_TESTS_SUPPORT_BALANCER_PROCESS_H_

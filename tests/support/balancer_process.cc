#include "tests/support/balancer_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "tests/support/child_process.h"
#include "tests/support/http_get.h"

extern char** environ;  // The environment the balancer inherits.

namespace attnserve::scale_test {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::string HaproxyBinaryPath() {
  if (const char* env = std::getenv("ATTNSERVE_HAPROXY_BINARY"); env != nullptr && *env != '\0') {
    return env;
  }
  return ATTNSERVE_HAPROXY_BINARY;
}

std::string HaproxyConfigPath() { return ATTNSERVE_HAPROXY_CONFIG; }

absl::StatusOr<int> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("bind 127.0.0.1:0: ", std::strerror(error)));
  }
  close(fd);
  return ntohs(address.sin_port);
}

absl::StatusOr<std::unique_ptr<BalancerProcess>> BalancerProcess::Start(
    const std::vector<std::string>& replicas, std::chrono::milliseconds timeout, int listen_port) {
  std::unique_ptr<BalancerProcess> process(new BalancerProcess());
  absl::StatusOr<std::string> dir = server_test::MakeTempDir("attnserve_balancer_test");
  if (!dir.ok()) return dir.status();
  process->temp_dir_ = *dir;
  process->log_path_ = process->temp_dir_ + "/haproxy.log";
  absl::StatusOr<int> port = listen_port > 0 ? listen_port : PickFreePort();
  if (!port.ok()) return port.status();
  absl::StatusOr<int> metrics_port = PickFreePort();
  if (!metrics_port.ok()) return metrics_port.status();
  process->port_ = *port;
  process->metrics_port_ = *metrics_port;

  // The environment: ours, plus the variables the configuration reads.
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (!absl::StartsWith(*entry, "ATTNSERVE_BALANCER_") &&
        !absl::StartsWith(*entry, "ATTNSERVE_REPLICA_")) {
      environment.emplace_back(*entry);
    }
  }
  environment.push_back(absl::StrCat("ATTNSERVE_BALANCER_LISTEN=127.0.0.1:", *port));
  environment.push_back(absl::StrCat("ATTNSERVE_BALANCER_METRICS=127.0.0.1:", *metrics_port));
  for (size_t i = 0; i < replicas.size(); ++i) {
    environment.push_back(absl::StrCat("ATTNSERVE_REPLICA_", i, "=", replicas[i]));
  }
  std::vector<char*> envp;
  for (std::string& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);
  absl::StatusOr<pid_t> spawned = server_test::SpawnLogged(
      {HaproxyBinaryPath(), "-db", "-f", HaproxyConfigPath()}, process->log_path_, envp.data());
  if (!spawned.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        spawned.status().message(), " (deploy/setup.sh installs Debian's haproxy)"));
  }
  const pid_t pid = *spawned;
  process->pid_ = pid;

  const Clock::time_point deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    int wait_status = 0;
    if (waitpid(pid, &wait_status, WNOHANG) == pid) {
      process->pid_ = -1;
      return absl::InternalError(absl::StrCat("haproxy exited during startup (status ", wait_status,
                                              ")\nlog:\n", process->LogTail()));
    }
    if (const int fd = server_test::ConnectLoopback(*port, std::chrono::milliseconds(500)); fd >= 0) {
      close(fd);
      return process;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("haproxy not listening on port ", *port,
                                                  " after ", timeout.count(), " ms\nlog:\n",
                                                  process->LogTail()));
}

BalancerProcess::~BalancerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);  // haproxy -db stops at once on SIGTERM ("hard stop").
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(5);
    int wait_status = 0;
    while (waitpid(pid_, &wait_status, WNOHANG) != pid_) {
      if (Clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &wait_status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  server_test::RemoveTempDir(temp_dir_);
}

absl::StatusOr<std::map<std::string, BalancerProcess::ServerState>> BalancerProcess::ServerStates()
    const {
  absl::StatusOr<server_test::HttpAnswer> answer =
      server_test::HttpGet(metrics_port_, "/stats;csv", std::chrono::seconds(5));
  if (!answer.ok()) return answer.status();
  const std::string* response = &answer->response;
  // The CSV starts at its header line; the body may come chunked (the chunk-size lines have too
  // few fields to be taken for servers).
  const size_t csv = response->find("# pxname");
  if (csv == std::string::npos) return absl::InternalError(absl::StrCat("stats: ", *response));
  std::vector<std::string> lines =
      absl::StrSplit(absl::string_view(*response).substr(csv), '\n', absl::SkipEmpty());
  for (std::string& line : lines) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
  }
  const std::vector<std::string> columns = absl::StrSplit(lines[0].substr(2), ',');
  int name_column = -1, status_column = -1, check_column = -1, proxy_column = -1;
  for (int i = 0; i < static_cast<int>(columns.size()); ++i) {
    if (columns[i] == "pxname") proxy_column = i;
    if (columns[i] == "svname") name_column = i;
    if (columns[i] == "status") status_column = i;
    if (columns[i] == "check_status") check_column = i;
  }
  if (proxy_column < 0 || name_column < 0 || status_column < 0 || check_column < 0) {
    return absl::InternalError(absl::StrCat("stats: missing columns in ", lines[0]));
  }
  std::map<std::string, ServerState> states;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> fields = absl::StrSplit(lines[i], ',');
    if (static_cast<int>(fields.size()) <= std::max(status_column, check_column)) continue;
    if (fields[proxy_column] != "attnserve" || fields[name_column] == "BACKEND") continue;
    // "* L7OK": the "* " marks a check in progress; the outcome is that of the last one.
    std::string check = fields[check_column];
    if (absl::StartsWith(check, "* ")) check = check.substr(2);
    states[fields[name_column]] = {fields[status_column], check};
  }
  return states;
}

std::string BalancerProcess::LogTail(size_t max_bytes) const {
  std::ifstream in(log_path_, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() <= max_bytes ? all : all.substr(all.size() - max_bytes);
}

}  // namespace attnserve::scale_test

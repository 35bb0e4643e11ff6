#include "tests/support/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/support/child_process.h"

namespace attnserve::server_test {

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::system_clock::time_point DeadlineIn(std::chrono::milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

ExitState DecodeWaitStatus(int wait_status) {
  ExitState state;
  if (WIFEXITED(wait_status)) {
    state.exited = true;
    state.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    state.signal = WTERMSIG(wait_status);
  }
  return state;
}

// The port file holds the bound port as decimal text; a partial write reads as "not yet".
std::optional<int> ReadPortFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  std::string content = text.str();
  while (!content.empty() && (content.back() == '\n' || content.back() == ' ')) content.pop_back();
  int port = 0;
  if (!absl::SimpleAtoi(content, &port) || port <= 0 || port > 65535) return std::nullopt;
  return port;
}

}  // namespace

std::string ServerBinaryPath() {
  if (const char* env = std::getenv("ATTNSERVE_SERVER_BINARY"); env != nullptr && *env != '\0') {
    return env;
  }
  return ATTNSERVE_SERVER_BINARY;
}

std::string ExitState::ToString() const {
  return exited ? absl::StrCat("exited with code ", exit_code)
                : absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")");
}

namespace {
const ProcessLimits kNoLimits;
}  // namespace

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::StartWithLimits(
    const std::vector<std::string>& flags, const ProcessLimits& limits,
    std::chrono::milliseconds startup_timeout) {
  return StartImpl(flags, startup_timeout, nullptr, "127.0.0.1", limits);
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::vector<std::string>& flags, std::chrono::milliseconds startup_timeout,
    std::shared_ptr<grpc::ChannelCredentials> credentials, const std::string& host) {
  return StartImpl(flags, startup_timeout, std::move(credentials), host, kNoLimits);
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::StartImpl(
    const std::vector<std::string>& flags, std::chrono::milliseconds startup_timeout,
    std::shared_ptr<grpc::ChannelCredentials> credentials, const std::string& host,
    const ProcessLimits& limits) {
  std::unique_ptr<ServerProcess> process(new ServerProcess());
  process->host_ = host;
  process->credentials_ = std::move(credentials);
  absl::StatusOr<std::string> dir = MakeTempDir("attnserve_server_test");
  if (!dir.ok()) return dir.status();
  process->temp_dir_ = *dir;
  process->log_path_ = process->temp_dir_ + "/server.log";
  const std::string port_file = process->temp_dir_ + "/port";

  // --backend=cpu: the tests' expectations are the CPU backend's, whether or not this binary has
  // CUDA and a device (the server's default is auto); a --backend in `flags` comes later and wins.
  std::vector<std::string> args = {ServerBinaryPath(), "--listen=" + host + ":0",
                                   "--port_file=" + port_file, "--backend=cpu"};
  args.insert(args.end(), flags.begin(), flags.end());
  absl::StatusOr<pid_t> pid = SpawnLogged(args, process->log_path_, nullptr, limits);
  if (!pid.ok()) return pid.status();
  process->pid_ = *pid;

  const std::string command = absl::StrJoin(args, " ");
  const Clock::time_point deadline = Clock::now() + startup_timeout;
  // 1. The port file.
  while (true) {
    if (std::optional<ExitState> ended = process->TryWait()) {
      return absl::InternalError(absl::StrCat("server ", ended->ToString(), " before writing ",
                                              port_file, "\ncommand: ", command, "\nlog:\n",
                                              process->LogTail()));
    }
    if (std::optional<int> port = ReadPortFile(port_file)) {
      process->port_ = *port;
      break;
    }
    if (Clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no port in ", port_file, " after ", startup_timeout.count(),
                       " ms\ncommand: ", command, "\nlog:\n", process->LogTail()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // 2. Health SERVING.
  std::shared_ptr<grpc::Channel> channel = process->NewChannel();
  absl::Status last = absl::UnknownError("no health check made");
  while (Clock::now() < deadline) {
    if (std::optional<ExitState> ended = process->TryWait()) {
      return absl::InternalError(absl::StrCat("server ", ended->ToString(), " during startup",
                                              "\nlog:\n", process->LogTail()));
    }
    absl::StatusOr<int> health = HealthCheck(*channel, "", std::chrono::milliseconds(1000));
    if (health.ok() && *health == grpc::health::v1::HealthCheckResponse::SERVING) {
      return process;
    }
    last = health.ok() ? absl::UnavailableError(absl::StrCat("health status ", *health))
                       : health.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "server on port ", process->port_, " not SERVING after ", startup_timeout.count(),
      " ms: ", last.ToString(), "\nlog:\n", process->LogTail()));
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !TryWait().has_value()) {
    kill(pid_, SIGKILL);
    int wait_status = 0;
    waitpid(pid_, &wait_status, 0);  // SIGKILL cannot be ignored: this returns promptly.
  }
  RemoveTempDir(temp_dir_);
}

std::shared_ptr<grpc::Channel> ServerProcess::NewChannel() const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  return grpc::CreateCustomChannel(
      address(), credentials_ != nullptr ? credentials_ : grpc::InsecureChannelCredentials(), args);
}

void ServerProcess::Signal(int signal) const {
  if (pid_ > 0 && !reaped_) kill(pid_, signal);
}

std::optional<ExitState> ServerProcess::TryWait() {
  if (reaped_) return exit_state_;
  if (pid_ <= 0) return std::nullopt;
  int wait_status = 0;
  const pid_t result = waitpid(pid_, &wait_status, WNOHANG);
  if (result == pid_) {
    reaped_ = true;
    exit_state_ = DecodeWaitStatus(wait_status);
    return exit_state_;
  }
  return std::nullopt;
}

absl::StatusOr<ExitState> ServerProcess::Terminate(std::chrono::milliseconds timeout) {
  if (std::optional<ExitState> ended = TryWait()) return *ended;
  kill(pid_, SIGTERM);
  const Clock::time_point deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (std::optional<ExitState> ended = TryWait()) return *ended;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid_, SIGKILL);
  int wait_status = 0;
  waitpid(pid_, &wait_status, 0);
  reaped_ = true;
  exit_state_ = DecodeWaitStatus(wait_status);
  return absl::DeadlineExceededError(
      absl::StrCat("server did not exit within ", timeout.count(), " ms of SIGTERM; killed"));
}

namespace {

// A "Name:    12345 kB" field of /proc/<pid>/status, in bytes; -1 if unreadable.
int64_t ProcStatusBytes(pid_t pid, const std::string& name) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) == 0) {
      std::istringstream fields(line.substr(name.size()));
      int64_t kib = -1;
      fields >> kib;
      return kib < 0 ? -1 : kib * 1024;
    }
  }
  return -1;
}

}  // namespace

int64_t ServerProcess::ResidentBytes() const { return ProcStatusBytes(pid_, "VmRSS:"); }

int64_t ServerProcess::PeakResidentBytes() const { return ProcStatusBytes(pid_, "VmHWM:"); }

std::string ServerProcess::LogTail(size_t max_bytes) const {
  std::ifstream in(log_path_, std::ios::binary);
  if (!in) return "(no log)";
  std::stringstream text;
  text << in.rdbuf();
  std::string content = text.str();
  if (content.size() > max_bytes) content = "..." + content.substr(content.size() - max_bytes);
  return content;
}

absl::StatusOr<int> HealthCheck(grpc::Channel& channel, const std::string& service,
                                std::chrono::milliseconds timeout) {
  std::shared_ptr<grpc::Channel> shared(&channel, [](grpc::Channel*) {});
  auto stub = grpc::health::v1::Health::NewStub(shared);
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(timeout));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return FromGrpc(status);
  return static_cast<int>(response.status());
}

namespace {

absl::StatusOr<grpc::reflection::v1alpha::ServerReflectionResponse> ReflectOnce(
    grpc::Channel& channel, const grpc::reflection::v1alpha::ServerReflectionRequest& request,
    std::chrono::milliseconds timeout) {
  std::shared_ptr<grpc::Channel> shared(&channel, [](grpc::Channel*) {});
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(shared);
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(timeout));
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  if (!stream->Write(request) || !stream->WritesDone()) return FromGrpc(stream->Finish());
  const bool got = stream->Read(&response);
  grpc::Status status = stream->Finish();
  if (!status.ok()) return FromGrpc(status);
  if (!got) return absl::InternalError("reflection stream ended without a response");
  if (response.has_error_response()) {
    return absl::Status(static_cast<absl::StatusCode>(response.error_response().error_code()),
                        response.error_response().error_message());
  }
  return response;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ReflectionListServices(grpc::Channel& channel,
                                                                std::chrono::milliseconds timeout) {
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  absl::StatusOr<grpc::reflection::v1alpha::ServerReflectionResponse> response =
      ReflectOnce(channel, request, timeout);
  if (!response.ok()) return response.status();
  std::vector<std::string> names;
  for (const auto& service : response->list_services_response().service()) {
    names.push_back(service.name());
  }
  return names;
}

absl::StatusOr<std::vector<std::string>> ReflectionFileContainingSymbol(
    grpc::Channel& channel, const std::string& symbol, std::chrono::milliseconds timeout) {
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_file_containing_symbol(symbol);
  absl::StatusOr<grpc::reflection::v1alpha::ServerReflectionResponse> response =
      ReflectOnce(channel, request, timeout);
  if (!response.ok()) return response.status();
  const auto& files = response->file_descriptor_response().file_descriptor_proto();
  return std::vector<std::string>(files.begin(), files.end());
}

}  // namespace attnserve::server_test

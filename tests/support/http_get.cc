#include "tests/support/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attnserve::server_test {

int ConnectLoopback(int port, std::chrono::milliseconds timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (timeout.count() > 0) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
    tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

absl::StatusOr<HttpAnswer> HttpGet(int port, const std::string& path,
                                   std::chrono::milliseconds timeout) {
  const int fd = ConnectLoopback(port, timeout);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  // A server that refuses the connection at once (503 when it is full) may answer and close
  // before it has read the request: what it sent is still read.
  const bool sent = send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
                    static_cast<ssize_t>(request.size());
  HttpAnswer answer;
  char buffer[65536];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      answer.response.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat(
          "the answer to GET ", path, " did not end within ", timeout.count(), " ms"));
    } else if (errno != EINTR) {
      break;  // Reset by the server: what came before is the answer.
    }
  }
  close(fd);
  if (answer.response.empty()) {
    return absl::UnavailableError(
        absl::StrCat(sent ? "no answer to GET " : "cannot send GET ", path));
  }
  if (std::sscanf(answer.response.c_str(), "HTTP/1.%*d %d", &answer.status) != 1) {
    answer.status = -1;
  }
  const size_t header_end = answer.response.find("\r\n\r\n");
  if (header_end != std::string::npos) answer.body = answer.response.substr(header_end + 4);
  return answer;
}

absl::StatusOr<std::string> ScrapeMetrics(int port) {
  absl::StatusOr<HttpAnswer> answer = HttpGet(port, "/metrics");
  if (!answer.ok()) return answer.status();
  if (answer->status != 200 || answer->response.find("\r\n\r\n") == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("bad HTTP answer: ", answer->response.substr(0, 200)));
  }
  return std::move(answer->body);
}

}  // namespace attnserve::server_test

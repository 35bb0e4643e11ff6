#include "server/observability/metrics_http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/observability/scrape_request.h"

namespace attnserve::server {

namespace {

// How long unread request bytes (a body we never read) are drained after the answer, so that
// closing does not reset the connection before the client has read the answer.
constexpr absl::Duration kDrainTime = absl::Milliseconds(200);

std::string Answer(int status, absl::string_view content_type, const std::string& body,
                   bool head_only) {
  std::string out = absl::StrCat(
      "HTTP/1.1 ", status, " ", HttpReasonPhrase(status), "\r\nContent-Type: ", content_type,
      "\r\nContent-Length: ", body.size(), "\r\nCache-Control: no-store\r\nConnection: close\r\n");
  if (status == 405) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head_only) out += body;
  return out;
}

std::string ErrorAnswer(int status, absl::string_view why) {
  return Answer(status, "text/plain; charset=utf-8", absl::StrCat(why, "\n"), false);
}

// The end of the request head (just past its blank line), or npos.
size_t HeadEnd(const std::string& buffer) {
  const size_t crlf = buffer.find("\r\n\r\n");
  const size_t lf = buffer.find("\n\n");
  if (crlf == std::string::npos && lf == std::string::npos) return std::string::npos;
  if (lf == std::string::npos || (crlf != std::string::npos && crlf < lf)) return crlf + 4;
  return lf + 2;
}

}  // namespace

struct MetricsHttpServer::Connection {
  enum class State { kReading, kWriting, kDraining };
  int fd = -1;
  State state = State::kReading;
  absl::Time deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, Render render, const MetricsHttpLimits& limits) {
  const auto cannot = [&](absl::string_view why) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_address: cannot listen on '", address, "': ", why));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return cannot("expected host:port");
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (port.empty()) return cannot("expected host:port");

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.empty() || host == "*" ? nullptr : host.c_str(),
                                    port.c_str(), &hints, &found);
      error != 0) {
    return cannot(gai_strerror(error));
  }
  int listen_fd = -1;
  std::string last_error = "no address";
  for (addrinfo* ai = found; ai != nullptr && listen_fd < 0; ai = ai->ai_next) {
    const int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    listen_fd = fd;
  }
  freeaddrinfo(found);
  if (listen_fd < 0) return cannot(last_error);

  sockaddr_storage bound{};
  socklen_t bound_size = sizeof(bound);
  int bound_port = 0;
  if (getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_size) == 0) {
    bound_port = bound.ss_family == AF_INET6
                     ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                     : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0 || bound_port <= 0) {
    close(listen_fd);
    if (wake_fd >= 0) close(wake_fd);
    return cannot("cannot set up the server's socket");
  }
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(listen_fd, wake_fd, bound_port, std::move(render), limits));
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_fd, int port, Render render,
                                     const MetricsHttpLimits& limits)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      render_(std::move(render)),
      limits_(limits),
      thread_([this] { Loop(); }) {}

MetricsHttpServer::~MetricsHttpServer() {
  stop_.store(true);
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  close(listen_fd_);
  close(wake_fd_);
}

void MetricsHttpServer::Loop() {
  std::list<Connection> connections;
  std::vector<pollfd> fds;
  std::vector<Connection*> polled;  // polled[i] is the connection of fds[i + 2].

  // Moves `c` to writing `answer`.
  const auto reply = [&](Connection& c, std::string answer) {
    c.state = Connection::State::kWriting;
    c.out = std::move(answer);
    c.sent = 0;
    c.deadline = absl::Now() + limits_.response_timeout;
  };
  // Answers a complete head.
  const auto answer_head = [&](Connection& c, absl::string_view head) {
    const ScrapeVerdict verdict = JudgeScrapeRequest(head);
    if (verdict.status != 200) return reply(c, ErrorAnswer(verdict.status, verdict.why));
    try {
      reply(c,
            Answer(200, "text/plain; version=0.0.4; charset=utf-8", render_(), verdict.head_only));
    } catch (...) {  // A collector that throws costs this scrape, not the server.
      reply(c, Answer(500, "text/plain; charset=utf-8", "rendering the metrics failed\n", false));
    }
  };

  // Out of file descriptors, accept() fails while the listening socket stays readable: it is left
  // out of poll() for a moment instead of spinning.
  absl::Time accept_paused_until = absl::InfinitePast();
  while (!stop_.load()) {
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back(
        {listen_fd_, static_cast<short>(absl::Now() < accept_paused_until ? 0 : POLLIN), 0});
    absl::Time next_deadline = absl::Now() + absl::Seconds(1);
    if (accept_paused_until > absl::Now()) {
      next_deadline = std::min(next_deadline, accept_paused_until);
    }
    for (Connection& c : connections) {
      fds.push_back(
          {c.fd, static_cast<short>(c.state == Connection::State::kWriting ? POLLOUT : POLLIN), 0});
      polled.push_back(&c);
      next_deadline = std::min(next_deadline, c.deadline);
    }
    const int64_t wait_ms =
        std::max<int64_t>(0, absl::ToInt64Milliseconds(next_deadline - absl::Now()) + 1);
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
    if (ready < 0 && errno != EINTR) break;
    if (stop_.load()) break;

    // New connections; beyond the limit each is told 503 and closed.
    if (ready > 0 && (fds[1].revents & POLLIN) != 0) {
      for (int accepted = 0; accepted < 64; ++accepted) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            accept_paused_until = absl::Now() + absl::Milliseconds(100);
          }
          break;
        }
        if (static_cast<int>(connections.size()) >= limits_.max_connections) {
          const std::string busy = ErrorAnswer(503, "too many open connections");
          (void)!send(fd, busy.data(), busy.size(), MSG_NOSIGNAL);
          close(fd);
          continue;
        }
        Connection c;
        c.fd = fd;
        c.deadline = absl::Now() + limits_.request_timeout;
        connections.push_back(std::move(c));
      }
    }

    // Reads and writes. A connection closed here is marked with fd = -1 and erased below.
    for (size_t i = 0; i < polled.size(); ++i) {
      Connection& c = *polled[i];
      const short revents = fds[i + 2].revents;
      if (revents == 0) continue;
      if (c.state == Connection::State::kWriting) {
        const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) {
          close(c.fd);
          c.fd = -1;
          continue;
        }
        c.sent += static_cast<size_t>(n);
        if (c.sent == c.out.size()) {
          shutdown(c.fd, SHUT_WR);
          c.state = Connection::State::kDraining;
          c.deadline = absl::Now() + kDrainTime;
        }
        continue;
      }
      char buffer[4096];
      const ssize_t n = recv(c.fd, buffer, sizeof(buffer), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {  // The peer closed (or reset): nobody to answer.
        close(c.fd);
        c.fd = -1;
        continue;
      }
      if (c.state == Connection::State::kDraining) continue;
      c.in.append(buffer, static_cast<size_t>(n));
      const size_t end = HeadEnd(c.in);
      if (end != std::string::npos && end <= limits_.max_head_bytes) {
        answer_head(c, absl::string_view(c.in).substr(0, end));
      } else if (c.in.size() > limits_.max_head_bytes) {
        const bool line_too_long = c.in.find('\n') == std::string::npos;
        reply(c, line_too_long ? ErrorAnswer(414, "request line too long")
                               : ErrorAnswer(431, "request header fields too large"));
      }
      if (c.in.size() > limits_.max_head_bytes) c.in.clear();  // Bounded memory per connection.
    }

    // Deadlines: a head that is late is answered 408; an answer that is not taken, or a drain
    // that does not end, closes the connection.
    const absl::Time now = absl::Now();
    for (Connection& c : connections) {
      if (c.fd < 0 || now < c.deadline) continue;
      if (c.state == Connection::State::kReading) {
        reply(c, ErrorAnswer(408, "request head not received in time"));
        continue;
      }
      close(c.fd);
      c.fd = -1;
    }
    connections.remove_if([](const Connection& c) { return c.fd < 0; });
  }
  for (Connection& c : connections) close(c.fd);
}

}  // namespace attnserve::server

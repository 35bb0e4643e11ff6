#include "tests/support/raw_grpc_call.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace attnserve::server_test {

namespace {

constexpr uint32_t kStream = 1;
constexpr size_t kMaxFrame = 16384;  // SETTINGS_MAX_FRAME_SIZE's default.
enum FrameType : uint8_t {
  kData = 0,
  kHeaders = 1,
  kRstStream = 3,
  kSettings = 4,
  kPing = 6,
  kGoAway = 7,
  kWindowUpdate = 8,
  kContinuation = 9,
};
constexpr uint8_t kEndStream = 0x1;
constexpr uint8_t kAck = 0x1;
constexpr uint8_t kEndHeaders = 0x4;
constexpr uint8_t kPadded = 0x8;
constexpr uint8_t kPriority = 0x20;

uint32_t Be32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | u[3];
}

void AppendBe32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
}

// An HPACK string literal without Huffman coding (RFC 7541 5.2), lengths < 127 only.
void AppendHpackString(std::string& out, const std::string& s) {
  out.push_back(static_cast<char>(s.size()));
  out += s;
}

// "Literal Header Field without Indexing -- New Name" (RFC 7541 6.2.2).
void AppendHeader(std::string& out, const std::string& name, const std::string& value) {
  out.push_back('\0');
  AppendHpackString(out, name);
  AppendHpackString(out, value);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RawGrpcCall>> RawGrpcCall::Start(
    int port, const std::string& path,
    const std::vector<std::pair<std::string, std::string>>& metadata, uint32_t message_bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  std::unique_ptr<RawGrpcCall> call(new RawGrpcCall(fd));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(errno)));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::string headers;
  AppendHeader(headers, ":method", "POST");
  AppendHeader(headers, ":scheme", "http");
  AppendHeader(headers, ":path", path);
  AppendHeader(headers, ":authority", absl::StrCat("127.0.0.1:", port));
  AppendHeader(headers, "content-type", "application/grpc");
  AppendHeader(headers, "te", "trailers");
  for (const auto& [name, value] : metadata) AppendHeader(headers, name, value);
  std::string prefix(1, '\0');  // Not compressed.
  AppendBe32(prefix, message_bytes);
  if (absl::Status s = call->Write("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); !s.ok()) return s;
  if (absl::Status s = call->WriteFrame(kSettings, 0, 0, ""); !s.ok()) return s;
  if (absl::Status s = call->WriteFrame(kHeaders, kEndHeaders, kStream, headers); !s.ok()) return s;
  if (absl::Status s = call->WriteFrame(kData, 0, kStream, prefix); !s.ok()) return s;
  call->connection_window_ -= 5;
  call->stream_window_ -= 5;
  return call;
}

RawGrpcCall::~RawGrpcCall() {
  if (fd_ >= 0) close(fd_);
}

absl::Status RawGrpcCall::Write(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status RawGrpcCall::WriteFrame(uint8_t type, uint8_t flags, uint32_t stream,
                                     const std::string& payload) {
  std::string frame;
  frame.push_back(static_cast<char>(payload.size() >> 16));
  frame.push_back(static_cast<char>(payload.size() >> 8));
  frame.push_back(static_cast<char>(payload.size()));
  frame.push_back(static_cast<char>(type));
  frame.push_back(static_cast<char>(flags));
  AppendBe32(frame, stream);
  frame += payload;
  return Write(frame);
}

absl::Status RawGrpcCall::ReadExactly(char* data, size_t size, absl::Time deadline,
                                      bool* timed_out) {
  *timed_out = false;
  size_t done = 0;
  while (done < size) {
    pollfd p{fd_, POLLIN, 0};
    const int64_t wait_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(wait_ms, 60000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      if (absl::Now() < deadline) continue;
      if (done == 0) {
        *timed_out = true;
        return absl::OkStatus();
      }
      return absl::DeadlineExceededError("a frame was cut off");
    }
    const ssize_t n = recv(fd_, data + done, size - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return absl::UnavailableError("the server closed the connection");
    if (n < 0) return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> RawGrpcCall::ReadFrame(absl::Time deadline) {
  char head[9];
  bool timed_out = false;
  if (absl::Status s = ReadExactly(head, sizeof(head), deadline, &timed_out); !s.ok()) return s;
  if (timed_out) return false;
  const size_t length = (static_cast<size_t>(static_cast<unsigned char>(head[0])) << 16) |
                        (static_cast<size_t>(static_cast<unsigned char>(head[1])) << 8) |
                        static_cast<unsigned char>(head[2]);
  const uint8_t type = static_cast<uint8_t>(head[3]);
  const uint8_t flags = static_cast<uint8_t>(head[4]);
  const uint32_t stream = Be32(head + 5) & 0x7fffffff;
  std::string payload(length, '\0');
  // The rest of a frame whose head arrived comes promptly; a generous bound, not an ordering.
  if (absl::Status s = ReadExactly(payload.data(), length, absl::Now() + absl::Seconds(30),
                                   &timed_out);
      !s.ok() || timed_out) {
    return s.ok() ? absl::DeadlineExceededError("a frame's payload did not come") : s;
  }
  switch (type) {
    case kSettings:
      if ((flags & kAck) != 0) break;
      for (size_t i = 0; i + 6 <= payload.size(); i += 6) {
        const int id = (static_cast<unsigned char>(payload[i]) << 8) |
                       static_cast<unsigned char>(payload[i + 1]);
        if (id == 4) {
          // SETTINGS_INITIAL_WINDOW_SIZE moves every open stream's window by the change from the
          // value before (gRPC sends it more than once: it shrinks it under memory pressure).
          const int64_t value = Be32(payload.data() + i + 2);
          stream_window_ += value - initial_window_;
          initial_window_ = value;
        }
      }
      if (absl::Status s = WriteFrame(kSettings, kAck, 0, ""); !s.ok()) return s;
      break;
    case kPing:
      if ((flags & kAck) == 0) {
        if (absl::Status s = WriteFrame(kPing, kAck, 0, payload); !s.ok()) return s;
      }
      break;
    case kWindowUpdate:
      if (payload.size() == 4) {
        (stream == 0 ? connection_window_ : stream_window_) += Be32(payload.data()) & 0x7fffffff;
      }
      break;
    case kHeaders:
    case kContinuation: {
      if (stream != kStream) break;
      size_t begin = 0;
      size_t end = payload.size();
      if (type == kHeaders && (flags & kPadded) != 0 && !payload.empty()) {
        begin = 1;
        end -= static_cast<unsigned char>(payload[0]);
      }
      if (type == kHeaders && (flags & kPriority) != 0) begin += 5;
      header_block_.append(payload, begin, end > begin ? end - begin : 0);
      if (type == kHeaders && (flags & kEndStream) != 0) end_.trailers.clear(), ended_ = true;
      if ((flags & kEndHeaders) != 0) {
        if (ended_) end_.trailers = header_block_;
        header_block_.clear();
      }
      break;
    }
    case kRstStream:
      if (stream == kStream && payload.size() == 4) {
        end_.reset = true;
        end_.reset_code = Be32(payload.data());
        ended_ = true;
      }
      break;
    case kGoAway:
      ended_ = true;
      break;
    default:
      break;
  }
  return true;
}

absl::StatusOr<int64_t> RawGrpcCall::SendBody(int64_t bytes, absl::Duration stall) {
  int64_t sent = 0;
  absl::Time stalled_at = absl::Now() + stall;
  while (sent < bytes && !ended_) {
    const int64_t window = std::min(connection_window_, stream_window_);
    if (window <= 0) {
      absl::StatusOr<bool> read = ReadFrame(stalled_at);
      if (!read.ok()) return read.status();
      if (!*read) break;  // No window opened for `stall`.
      continue;
    }
    const size_t n = static_cast<size_t>(
        std::min<int64_t>({window, bytes - sent, static_cast<int64_t>(kMaxFrame)}));
    if (absl::Status s = WriteFrame(kData, 0, kStream, std::string(n, '\0')); !s.ok()) {
      // The server may close the connection once it refused the call.
      if (ended_) break;
      return s;
    }
    sent += static_cast<int64_t>(n);
    connection_window_ -= static_cast<int64_t>(n);
    stream_window_ -= static_cast<int64_t>(n);
    stalled_at = absl::Now() + stall;
    // Take in what the server sent meanwhile (window updates, or its answer) without waiting.
    while (true) {
      absl::StatusOr<bool> read = ReadFrame(absl::Now());
      if (!read.ok()) return ended_ ? absl::StatusOr<int64_t>(sent) : read.status();
      if (!*read) break;
    }
  }
  return sent;
}

absl::StatusOr<RawGrpcCall::End> RawGrpcCall::AwaitEnd(absl::Time deadline) {
  while (!ended_) {
    absl::StatusOr<bool> read = ReadFrame(deadline);
    if (!read.ok()) return read.status();
    if (!*read) {
      return absl::DeadlineExceededError("the server did not end the stream by the deadline");
    }
  }
  return end_;
}

int RawGrpcCall::GrpcStatus(const std::string& trailers) {
  // A literal field (any of RFC 7541's three kinds) whose name and value are plain strings.
  const std::string name = std::string(1, '\x0b') + "grpc-status";
  const size_t at = trailers.find(name);
  if (at == std::string::npos || at + name.size() >= trailers.size()) return -1;
  const size_t length = static_cast<unsigned char>(trailers[at + name.size()]);
  if ((length & 0x80) != 0 || at + name.size() + 1 + length > trailers.size()) return -1;
  int code = 0;
  for (size_t i = 0; i < length; ++i) {
    const char c = trailers[at + name.size() + 1 + i];
    if (c < '0' || c > '9') return -1;
    code = code * 10 + (c - '0');
  }
  return code;
}

}  // namespace attnserve::server_test

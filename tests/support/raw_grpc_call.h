// One gRPC call spoken as raw HTTP/2 frames over a plaintext TCP connection of its own, so that a
// test can send part of a request's body and see what the server does before the rest comes (a
// gRPC client only ever sends whole messages). Not a general HTTP/2 client: one stream, no
// Huffman coding, frames of at most 16 KiB.
#ifndef ATTNSERVE_TESTS_SUPPORT_RAW_GRPC_CALL_H_
#define ATTNSERVE_TESTS_SUPPORT_RAW_GRPC_CALL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attnserve::server_test {

class RawGrpcCall {
 public:
  // How the server ended the stream.
  struct End {
    std::string trailers;  // The HPACK block of its last HEADERS frame, as received.
    uint32_t reset_code = 0;  // RST_STREAM's error code, when it reset the stream instead.
    bool reset = false;
  };

  // Connects to 127.0.0.1:`port` and opens the call: HEADERS for `path` (e.g.
  // "/attnserve.v1.AttentionService/Configure") with `metadata`, then the 5-byte gRPC prefix of a
  // message of `message_bytes`, none of whose body is sent yet.
  static absl::StatusOr<std::unique_ptr<RawGrpcCall>> Start(
      int port, const std::string& path,
      const std::vector<std::pair<std::string, std::string>>& metadata, uint32_t message_bytes);
  ~RawGrpcCall();

  // Sends up to `bytes` more of the body (zeros) as the server's flow-control windows allow,
  // reading its frames meanwhile. Returns the bytes sent: fewer when the server ended the stream,
  // or when no window opened for `stall` (the server wants no more for now).
  absl::StatusOr<int64_t> SendBody(int64_t bytes, absl::Duration stall);
  // Waits until the server ends the stream, or `deadline` (DEADLINE_EXCEEDED).
  absl::StatusOr<End> AwaitEnd(absl::Time deadline);
  // Whether the server has ended the stream (as far as the frames read so far tell).
  bool ended() const { return ended_; }
  // The grpc-status value in `trailers` (gRPC's HPACK encoder sends it as a literal), or -1.
  static int GrpcStatus(const std::string& trailers);

 private:
  explicit RawGrpcCall(int fd) : fd_(fd) {}
  absl::Status Write(const std::string& bytes);
  absl::Status WriteFrame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload);
  // Reads and handles one frame, waiting until `deadline`; false when none came by then.
  absl::StatusOr<bool> ReadFrame(absl::Time deadline);
  absl::Status ReadExactly(char* data, size_t size, absl::Time deadline, bool* timed_out);

  int fd_ = -1;
  int64_t connection_window_ = 65535;
  int64_t stream_window_ = 65535;
  int64_t initial_window_ = 65535;  // The server's SETTINGS_INITIAL_WINDOW_SIZE.
  bool ended_ = false;
  End end_;
  std::string header_block_;  // HEADERS + CONTINUATION of the stream, until END_HEADERS.
};

}  // namespace attnserve::server_test

#endif  // ATTNSERVE_TESTS_SUPPORT_RAW_GRPC_CALL_H_

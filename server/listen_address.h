// The --listen address, checked before gRPC sees it.
//
// gRPC is lenient where a typo should stop the server: "127.0.0.1" (no port) listens on 443, and
// "localhost:99999" on whatever port the kernel picks. ParseListenAddress accepts HOST:PORT,
// [IPV6]:PORT and unix:PATH / unix-abstract:NAME, with PORT a decimal number in [0, 65535]
// (0 picks a free port); anything else is INVALID_ARGUMENT naming --listen.
#ifndef ATTNSERVE_SERVER_LISTEN_ADDRESS_H_
#define ATTNSERVE_SERVER_LISTEN_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnserve::server {

struct ListenAddress {
  std::string host;  // Without brackets; empty for a unix socket (or ":PORT", every interface).
  int port = 0;      // 0 = a free port; unused for a unix socket.
  bool unix_socket = false;
};

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view address);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_LISTEN_ADDRESS_H_

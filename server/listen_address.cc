#include "server/listen_address.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kernels/base/clip_for_message.h"

namespace attnserve::server {

namespace {

absl::Status Invalid(absl::string_view address, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--listen = '", ClipForMessage(address), "': ", why,
      "; expected HOST:PORT or [IPV6]:PORT with PORT in [0, 65535] (0 = a free port)"));
}

}  // namespace

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view address) {
  ListenAddress parsed;
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    parsed.unix_socket = true;
    return parsed;
  }
  absl::string_view host;
  absl::string_view port;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return Invalid(address, "no ']' after the IPv6 host");
    host = address.substr(1, close - 1);
    absl::string_view rest = address.substr(close + 1);
    if (!absl::ConsumePrefix(&rest, ":")) return Invalid(address, "no port");
    port = rest;
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return Invalid(address, "no port");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    // "::1:50051" is ambiguous; gRPC would read it in its own way.
    if (absl::StrContains(host, ':')) return Invalid(address, "an IPv6 host goes in brackets");
  }
  if (port.empty()) return Invalid(address, "no port");
  // Digits only (SimpleAtoi also takes "+5" and " 5"); at most 5, so the value fits an int.
  for (const char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return Invalid(address, absl::StrCat("port '", ClipForMessage(port), "' is not a number"));
    }
  }
  int value = 0;
  if (port.size() > 5 || !absl::SimpleAtoi(port, &value) || value > 65535) {
    return Invalid(address, absl::StrCat("port ", ClipForMessage(port), " is out of range"));
  }
  parsed.host = std::string(host);
  parsed.port = value;
  return parsed;
}

}  // namespace attnserve::server

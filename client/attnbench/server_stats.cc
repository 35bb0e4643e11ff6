#include "client/attnbench/server_stats.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace attnserve {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Integer fields of `message` and its singular sub-messages (two levels), by dotted path.
void CollectIntegers(const Message& message, const std::string& prefix, int depth,
                     std::map<std::string, double>* out) {
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  const google::protobuf::Reflection* reflection = message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) continue;
    const std::string path =
        prefix.empty() ? field->name() : absl::StrCat(prefix, ".", field->name());
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        (*out)[path] = reflection->GetInt32(message, field);
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        (*out)[path] = static_cast<double>(reflection->GetInt64(message, field));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        (*out)[path] = reflection->GetUInt32(message, field);
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        (*out)[path] = static_cast<double>(reflection->GetUInt64(message, field));
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth > 0) {
          CollectIntegers(reflection->GetMessage(message, field), path, depth - 1, out);
        }
        break;
      default:
        break;
    }
  }
}

std::string LastName(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}
std::string Parent(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

// Finds a (batches, steps) counter pair among `fields`: a field named "*batches" and, under the
// same parent, one naming the steps (or items/tokens) those batches held. Decode counters win
// over others (a server may count prefill chunks as batches too).
void AddCounterSources(const std::map<std::string, double>& fields, const std::string& rpc,
                       std::map<std::string, BatchCounter>* sources) {
  static const char* const kStepNames[] = {
      "decode_batched_steps",  "batched_steps",       "decode_batch_steps", "decode_steps",
      "decode_batch_size_sum", "batch_size_sum",      "decode_batch_items", "batched_items",
      "decode_items",          "decode_batch_tokens", "decode_tokens",      "batch_steps"};
  for (const auto& [path, batches] : fields) {
    const std::string name = LastName(path);
    if (!absl::EndsWith(name, "batches")) continue;
    if (absl::StrContains(name, "prefill")) continue;
    for (const char* step_name : kStepNames) {
      const std::string parent = Parent(path);
      const std::string step_path =
          parent.empty() ? step_name : absl::StrCat(parent, ".", step_name);
      auto it = fields.find(step_path);
      if (it == fields.end()) continue;
      (*sources)[absl::StrCat(rpc, " ", step_path, "/", path)] = {batches, it->second};
      break;
    }
  }
}

// Sums the histogram `name`'s _sum and _count series whose variant label matches.
bool ParseHistogram(const std::string& text, const std::string& name,
                    const std::string& variant_label, BatchCounter* counter) {
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const bool is_sum = absl::StartsWith(line, name + "_sum");
    const bool is_count = absl::StartsWith(line, name + "_count");
    if (!is_sum && !is_count) continue;
    absl::string_view rest = line.substr(name.size() + (is_sum ? 4 : 6));
    std::string labels;
    if (absl::StartsWith(rest, "{")) {
      const size_t close = rest.find('}');
      if (close == absl::string_view::npos) continue;
      labels = std::string(rest.substr(1, close - 1));
      rest = rest.substr(close + 1);
    } else if (!absl::StartsWith(rest, " ")) {
      continue;  // Another metric sharing the prefix.
    }
    // variant="mha" or variant="mha_swa"; no label at all: not per-variant, skip.
    const size_t at = labels.find("variant=\"");
    if (at == std::string::npos) continue;
    const size_t start = at + 9;
    const size_t end = labels.find('"', start);
    if (end == std::string::npos) continue;
    const std::string value = labels.substr(start, end - start);
    if (value != variant_label && !absl::StartsWith(value, variant_label + "_")) continue;
    std::vector<absl::string_view> parts =
        absl::StrSplit(absl::StripAsciiWhitespace(rest), ' ', absl::SkipEmpty());
    double number = 0;
    if (parts.empty() || !absl::SimpleAtod(parts[0], &number)) continue;
    (is_sum ? counter->steps : counter->batches) += number;
    found = true;
  }
  return found;
}

}  // namespace

bool HttpGet(const std::string& host_port, const std::string& path, absl::Duration timeout,
             std::string* body, std::string* error) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    *error = absl::StrCat("'", host_port, "' is not HOST:PORT");
    return false;
  }
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &addresses); rc != 0) {
    *error = absl::StrCat("resolve ", host_port, ": ", gai_strerror(rc));
    return false;
  }
  const absl::Time deadline = absl::Now() + timeout;
  auto wait = [&](int fd, short events) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return false;
    pollfd p{fd, events, 0};
    return poll(&p, 1, static_cast<int>(ms)) == 1;
  };
  int fd = -1;
  for (addrinfo* a = addresses; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      int so_error = errno;
      if (so_error == EINPROGRESS && wait(fd, POLLOUT)) {
        socklen_t length = sizeof(so_error);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &length);
      }
      if (so_error != 0 && so_error != EINPROGRESS) {
        *error = absl::StrCat("connect ", host_port, ": ", std::strerror(so_error));
      }
      if (so_error != 0) {
        close(fd);
        fd = -1;
      }
    }
  }
  freeaddrinfo(addresses);
  if (fd < 0) {
    if (error->empty()) *error = absl::StrCat("connect ", host_port, ": timed out");
    return false;
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\nConnection: close\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    if (!wait(fd, POLLOUT)) break;
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string response;
  bool eof = false;
  while (sent == request.size() && wait(fd, POLLIN)) {
    char buffer[16384];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {
      eof = n == 0;
      break;
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (!eof) {
    *error = absl::StrCat("GET http://", host_port, path, ": no complete answer within ",
                          absl::FormatDuration(timeout));
    return false;
  }
  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos || !absl::StartsWith(response, "HTTP/1.")) {
    *error = absl::StrCat("GET http://", host_port, path, ": not an HTTP response");
    return false;
  }
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (!absl::StrContains(status_line, " 200")) {
    *error = absl::StrCat("GET http://", host_port, path, ": ", status_line);
    return false;
  }
  *body = response.substr(header_end + 4);
  return true;
}

ServerBatchStats::ServerBatchStats(const Client& client, std::string metrics_address,
                                   absl::Duration timeout)
    : client_(client), metrics_path_("/metrics"), timeout_(timeout) {
  absl::string_view address = metrics_address;
  absl::ConsumePrefix(&address, "http://");
  const size_t slash = address.find('/');
  if (slash != absl::string_view::npos) {
    metrics_path_ = std::string(address.substr(slash));
    address = address.substr(0, slash);
  }
  metrics_host_port_ = std::string(address);
}

BatchSnapshot ServerBatchStats::Take(const std::string& session_id,
                                     const std::string& variant_label) const {
  BatchSnapshot snapshot;
  {
    v1::GetSessionRequest request;
    request.set_session_id(session_id);
    v1::GetSessionResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    if (client_.stub->GetSession(&context, request, &response).ok()) {
      std::map<std::string, double> fields;
      CollectIntegers(response.session(), "", 2, &fields);
      AddCounterSources(fields, "GetSession", &snapshot.sources);
      for (const auto& [path, value] : fields) {
        const std::string name = LastName(path);
        if (name == "max_decode_batch" || name == "max_batch_size") snapshot.max_batch = value;
      }
    }
  }
  {
    v1::GetServerInfoResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    if (client_.stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &response).ok()) {
      std::map<std::string, double> fields;
      CollectIntegers(response, "", 2, &fields);
      AddCounterSources(fields, "GetServerInfo", &snapshot.sources);
    }
  }
  if (!metrics_host_port_.empty()) {
    std::string body;
    if (HttpGet(metrics_host_port_, metrics_path_, timeout_, &body, &snapshot.metrics_error)) {
      BatchCounter counter;
      if (ParseHistogram(body, "attnserve_batch_size", variant_label, &counter)) {
        snapshot.sources[absl::StrCat("/metrics attnserve_batch_size{variant=\"", variant_label,
                                      "\"}")] = counter;
      } else {
        snapshot.metrics_error = absl::StrCat("no attnserve_batch_size series with variant=\"",
                                              variant_label, "\" at ", metrics_host_port_);
      }
    }
  }
  return snapshot;
}

BatchSummary ServerBatchStats::Between(const BatchSnapshot& before, const BatchSnapshot& after) {
  BatchSummary summary;
  summary.max = after.max_batch;
  std::vector<std::pair<int, std::string>> ranked;  // Preference order, source name.
  for (const auto& [source, counter] : after.sources) {
    if (!before.sources.count(source)) continue;
    const int rank = absl::StartsWith(source, "GetSession") ? 0
                     : absl::StartsWith(source, "/metrics") ? 1
                                                            : 2;
    ranked.emplace_back(rank, source);
  }
  std::sort(ranked.begin(), ranked.end());
  for (const auto& [rank, source] : ranked) {
    const BatchCounter& a = after.sources.at(source);
    const BatchCounter& b = before.sources.at(source);
    const double batches = a.batches - b.batches;
    const double steps = a.steps - b.steps;
    if (batches <= 0) continue;
    if (!summary.available) {
      summary.available = true;
      summary.source = source;
      summary.mean = steps / batches;
      summary.batches = batches;
    } else {
      absl::StrAppend(&summary.note, summary.note.empty() ? "" : "; ", source, ": mean ",
                      steps / batches);
    }
  }
  if (!summary.available) {
    summary.note = ranked.empty() ? "the server exposes no batch counters (GetSession, "
                                    "GetServerInfo) and no /metrics was given or readable"
                                  : "the server's batch counters did not move";
    if (!after.metrics_error.empty()) absl::StrAppend(&summary.note, "; ", after.metrics_error);
  }
  return summary;
}

}  // namespace attnserve

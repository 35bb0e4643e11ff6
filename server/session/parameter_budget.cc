#include "server/session/parameter_budget.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace attnserve::server {

ParameterCharge::ParameterCharge(ParameterCharge&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

ParameterCharge& ParameterCharge::operator=(ParameterCharge&& other) noexcept {
  if (this != &other) {
    ShrinkTo(0);
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

ParameterCharge::~ParameterCharge() { ShrinkTo(0); }

void ParameterCharge::ShrinkTo(int64_t bytes) {
  if (budget_ == nullptr || bytes >= bytes_) return;
  budget_->Release(bytes_ - bytes);
  bytes_ = bytes;
}

absl::StatusOr<ParameterCharge> ParameterBudget::Charge(int64_t bytes, absl::string_view what) {
  int64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > capacity_ - used) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needs ", bytes, " bytes of parameter memory, ", capacity_ - used,
                       " of ", capacity_,
                       " bytes are free (--max_parameter_bytes); release a session or configure a "
                       "smaller layer"));
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return ParameterCharge(this, bytes);
}

namespace {

// A cgroup memory limit file's value; nullopt for "max", an absent or unreadable file, or v1's
// "unlimited" (a huge page-rounded number, past any machine's memory).
std::optional<int64_t> ReadCgroupLimit(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(text, &bytes) || bytes <= 0 || bytes >= (int64_t{1} << 62)) {
    return std::nullopt;
  }
  return bytes;
}

// The process's address space now (VmSize in /proc/self/status), in bytes; 0 if unknown.
int64_t AddressSpaceInUse() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmSize:", 0) != 0) continue;
    int64_t kib = 0;
    std::string number = line.substr(7);
    number.erase(0, number.find_first_not_of(" \t"));
    number = number.substr(0, number.find(' '));
    return absl::SimpleAtoi(number, &kib) ? kib * 1024 : 0;
  }
  return 0;
}

}  // namespace

int64_t ProcessMemoryLimit(std::string* source) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  int64_t limit = pages > 0 && page_size > 0 ? static_cast<int64_t>(pages) * page_size
                                             : int64_t{8} << 30;  // Unknown: a modest 8 GiB.
  std::string from = pages > 0 && page_size > 0 ? "physical memory" : "unknown physical memory";
  std::string seen = absl::StrCat(from, " ", limit);
  const auto consider = [&](std::optional<int64_t> bytes, const char* what) {
    if (!bytes.has_value()) return;
    absl::StrAppend(&seen, ", ", what, " ", *bytes);
    if (*bytes < limit) {
      limit = *bytes;
      from = what;
    }
  };
  consider(ReadCgroupLimit("/sys/fs/cgroup/memory.max"), "cgroup v2 memory.max");
  consider(ReadCgroupLimit("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
           "cgroup v1 memory.limit_in_bytes");
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    // RLIMIT_AS counts address space, not memory: the thread stacks, malloc arenas and library
    // buffers reserved already (most of a GiB with the backend's and gRPC's threads) are gone
    // from it, so what is left of it is what the process may still allocate.
    const int64_t limit_bytes =
        static_cast<int64_t>(std::min<rlim_t>(as.rlim_cur, rlim_t{1} << 62));
    consider(std::max<int64_t>(0, limit_bytes - AddressSpaceInUse()),
             "RLIMIT_AS less the address space in use");
  }
  if (source != nullptr) *source = absl::StrCat(from, " (", seen, ")");
  return limit;
}

int64_t DefaultMaxParameterBytes(std::string* source) {
  return ProcessMemoryLimit(source) / 2;
}

}  // namespace attnserve::server

#include "server/session/retained_outputs.h"

#include <utility>

namespace attnserve::server {

void RetainedOutputs::EraseLocked(std::map<uint64_t, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  if (it->second.tenant_bounded) {
    auto t = tenant_bytes_.find(it->second.tenant);
    if (t != tenant_bytes_.end() && (t->second -= it->second.bytes) <= 0) tenant_bytes_.erase(t);
  }
  entries_.erase(it);
}

uint64_t RetainedOutputs::Put(const std::string& tenant, bool tenant_bounded, Tensor output) {
  const int64_t bytes = static_cast<int64_t>(output.num_bytes());
  const bool own_bound = tenant_bounded && tenant_max_bytes_ > 0;
  absl::MutexLock lock(&mu_);
  if (bytes > max_bytes_ || (own_bound && bytes > tenant_max_bytes_)) {
    ++evictions_;
    return kNone;
  }
  if (own_bound) {
    // The tenant's own oldest outputs make room under its bound.
    for (auto it = entries_.begin(); it != entries_.end();) {
      auto t = tenant_bytes_.find(tenant);
      if (t == tenant_bytes_.end() || t->second + bytes <= tenant_max_bytes_) break;
      auto next = std::next(it);
      if (it->second.tenant_bounded && it->second.tenant == tenant) {
        EraseLocked(it);
        ++evictions_;
      }
      it = next;
    }
  }
  while (bytes_ + bytes > max_bytes_ && !entries_.empty()) {
    EraseLocked(entries_.begin());
    ++evictions_;
  }
  const uint64_t handle = next_++;
  Entry entry;
  entry.tenant = tenant;
  entry.tenant_bounded = tenant_bounded;
  entry.output = std::make_shared<const Tensor>(std::move(output));
  entry.bytes = bytes;
  entries_.emplace(handle, std::move(entry));
  bytes_ += bytes;
  if (tenant_bounded) tenant_bytes_[tenant] += bytes;
  return handle;
}

std::optional<Tensor> RetainedOutputs::Get(uint64_t handle) const {
  std::shared_ptr<const Tensor> output;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(handle);
    if (it == entries_.end()) return std::nullopt;
    output = it->second.output;
  }
  return *output;  // Copied outside the lock.
}

void RetainedOutputs::Release(uint64_t handle) {
  if (handle == kNone) return;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(handle);
  if (it != entries_.end()) EraseLocked(it);
}

int64_t RetainedOutputs::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

int64_t RetainedOutputs::evictions() const {
  absl::MutexLock lock(&mu_);
  return evictions_;
}

}  // namespace attnserve::server

// The outputs kept for call_id retries (Session::RequestState), under a byte bound.
//
// A request keeps the output of the last call applied to it under a call_id, so that a retry of
// that call (its answer lost to a deadline or the network) is answered without appending its
// tokens twice. Those outputs are as large as the calls' hidden rows (a 250-token Forward of
// d_model 65536 keeps 64 MiB) and were charged to nothing: enough distinct call_ids filled the
// process's memory. Every retained output is now held here, charged against the server's bound
// (--max_retained_output_bytes) and, for a non-admin tenant, against the tenant's own bound
// (--tenant_max_retained_output_bytes); storing one past a bound evicts the oldest outputs first
// (the tenant's own oldest when the tenant's bound is what is passed). A retry whose output was
// evicted is FAILED_PRECONDITION naming the call_id (Session::FillReplayLocked): the call was
// applied and cannot run twice.
//
// Thread-safe.
#ifndef ATTNSERVE_SERVER_SESSION_RETAINED_OUTPUTS_H_
#define ATTNSERVE_SERVER_SESSION_RETAINED_OUTPUTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kernels/core/tensor.h"

namespace attnserve::server {

class RetainedOutputs {
 public:
  // Handle of no output (never retained, or released).
  static constexpr uint64_t kNone = 0;

  // `max_bytes`: all outputs together (> 0). `tenant_max_bytes`: one tenant's (0 = no bound of
  // its own).
  RetainedOutputs(int64_t max_bytes, int64_t tenant_max_bytes)
      : max_bytes_(max_bytes), tenant_max_bytes_(tenant_max_bytes) {}

  // Keeps `output` for `tenant` ("" with `tenant_bounded` false: only the server's bound applies)
  // and returns its handle, after evicting the oldest outputs until it fits. kNone when the
  // output alone passes a bound (it is not kept; a retry then answers as for an evicted one).
  uint64_t Put(const std::string& tenant, bool tenant_bounded, Tensor output);
  // The output under `handle`; nullopt once evicted or released.
  std::optional<Tensor> Get(uint64_t handle) const;
  // Gives `handle`'s bytes back (no-op for kNone or an evicted handle).
  void Release(uint64_t handle);

  int64_t bytes() const;
  int64_t evictions() const;
  int64_t max_bytes() const { return max_bytes_; }

 private:
  struct Entry {
    std::string tenant;
    bool tenant_bounded = false;
    std::shared_ptr<const Tensor> output;
    int64_t bytes = 0;
  };
  void EraseLocked(std::map<uint64_t, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_bytes_;
  const int64_t tenant_max_bytes_;
  mutable absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);  // By handle: oldest first.
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int64_t> tenant_bytes_ ABSL_GUARDED_BY(mu_);
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_RETAINED_OUTPUTS_H_

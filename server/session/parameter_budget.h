// The bytes of layer weights the server may hold at once (--max_parameter_bytes).
//
// Configure charges a layer's weights here from its spec alone, before anything is allocated, so
// a layer too large for the machine is refused with RESOURCE_EXHAUSTED naming the numbers instead
// of ending the process on bad_alloc or the OOM killer. The charge lives as long as the session's
// layer (Session::HoldParameters) and is returned when the session is freed.
#ifndef ATTNSERVE_SERVER_SESSION_PARAMETER_BUDGET_H_
#define ATTNSERVE_SERVER_SESSION_PARAMETER_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve::server {

class ParameterBudget;

// Bytes charged to a ParameterBudget; returned when destroyed (or Shrink'ed). Move-only.
class ParameterCharge {
 public:
  ParameterCharge() = default;
  ParameterCharge(ParameterCharge&& other) noexcept;
  ParameterCharge& operator=(ParameterCharge&& other) noexcept;
  ParameterCharge(const ParameterCharge&) = delete;
  ParameterCharge& operator=(const ParameterCharge&) = delete;
  ~ParameterCharge();

  int64_t bytes() const { return bytes_; }
  // Returns all but `bytes` (<= bytes()) to the budget: what was only needed while building.
  void ShrinkTo(int64_t bytes);

 private:
  friend class ParameterBudget;
  ParameterCharge(ParameterBudget* budget, int64_t bytes) : budget_(budget), bytes_(bytes) {}

  ParameterBudget* budget_ = nullptr;
  int64_t bytes_ = 0;
};

class ParameterBudget {
 public:
  explicit ParameterBudget(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Charges `bytes`, or RESOURCE_EXHAUSTED (nothing charged) naming `what`, the bytes asked and
  // the bytes free. Thread-safe. The budget must outlive every charge.
  absl::StatusOr<ParameterCharge> Charge(int64_t bytes, absl::string_view what);

  int64_t capacity_bytes() const { return capacity_; }
  int64_t used_bytes() const { return used_.load(std::memory_order_relaxed); }

 private:
  friend class ParameterCharge;
  void Release(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  const int64_t capacity_;
  std::atomic<int64_t> used_{0};
};

// Bytes of `spec`'s weights in fp32: as every backend receives them, as the CPU backend keeps
// them, and the most any backend keeps (the CUDA backend's 16-bit layers keep half; a built layer
// says what it keeps, AttentionLayer::ParameterBytes).
inline int64_t LayerParameterBytes(const LayerSpec& spec) { return ParameterCount(spec) * 4; }

// Host bytes a Configure of `spec` needs at its peak: the fp32 weights as loaded (from a seed, a
// checkpoint or the request) and the layer's own copy, both alive until the layer is built.
inline int64_t ConfigurePeakParameterBytes(const LayerSpec& spec) {
  return 2 * LayerParameterBytes(spec);
}

// The memory this process may use: the least of the machine's physical memory, the cgroup's
// limit (v2 memory.max, v1 memory.limit_in_bytes; "max" or absent = none) and RLIMIT_AS less the
// address space the process already reserved (thread stacks, arenas). `source`
// (when not null) receives which one it is and the others' values, for the log.
int64_t ProcessMemoryLimit(std::string* source = nullptr);

// The default --max_parameter_bytes: half of ProcessMemoryLimit (the KV pool, the messages in
// flight and the process itself need the rest).
int64_t DefaultMaxParameterBytes(std::string* source = nullptr);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_PARAMETER_BUDGET_H_

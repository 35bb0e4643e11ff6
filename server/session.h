// A session: one attention layer (spec, weights, KV cache config) and the requests it serves.
//
// Threading: the compute methods (Step, ReleaseRequest, Close, ExpireRequests) run only on the
// session's SerialQueue, one at a time, so the engine layer is never entered concurrently and one
// request's steps apply in the order they arrived. The read-only methods (FillInfo, idle time,
// kv_bytes_used) may run on any thread; they take `mu_` only briefly and never wait on compute,
// so gRPC handlers can call them.
#ifndef ATTNSERVE_SERVER_SESSION_H_
#define ATTNSERVE_SERVER_SESSION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/backend.h"
#include "kernels/layer_spec.h"
#include "kernels/tensor.h"
#include "server/serial_queue.h"

namespace attnserve::server {

struct SessionLimits {
  int max_requests = 0;
  int64_t max_sequence_length = 0;
};

// One request's share of a Forward or Decode call, already validated by the codec.
struct StepInput {
  std::string request_id;
  Tensor hidden;                   // [num_tokens, d_model]; num_tokens == 1 for Decode.
  std::vector<int64_t> positions;  // One per token, or empty = continue from the length.
};

struct StepOutput {
  std::string request_id;
  Tensor output;  // [num_tokens, d_model], dtype of the input.
  int64_t sequence_length = 0;
};

class Session {
 public:
  Session(std::string id, std::string label, const LayerSpec& spec, DType kv_dtype,
          SessionLimits limits, std::unique_ptr<AttentionLayer> layer, v1::SessionCost cost,
          Executor* executor);

  const std::string& id() const { return id_; }
  const LayerSpec& spec() const { return spec_; }
  SerialQueue& queue() { return *queue_; }

  // ---- On the session's queue only -----------------------------------------------------------

  // Appends each input's tokens to its request. Forward (decode = false) creates unknown requests;
  // Decode requires them (NOT_FOUND). All-or-nothing: on error no request changes.
  // `compute_ns` receives the engine time.
  absl::StatusOr<std::vector<StepOutput>> Step(std::vector<StepInput> inputs, bool decode,
                                               int64_t* compute_ns);

  // Frees one request's pages; returns the bytes freed. NOT_FOUND for an unknown request.
  absl::StatusOr<int64_t> ReleaseRequest(const std::string& request_id);

  // Frees every request and the layer; later steps get NOT_FOUND. Returns the KV bytes freed.
  int64_t Close();

  // Releases requests idle for longer than `ttl`; returns how many.
  int ExpireRequests(absl::Time now, absl::Duration ttl);

  // ---- Any thread ----------------------------------------------------------------------------

  void FillInfo(absl::Time now, bool with_requests, v1::SessionInfo* info) const;
  absl::Duration IdleTime(absl::Time now) const;
  int64_t kv_bytes_used() const { return kv_bytes_used_.load(std::memory_order_relaxed); }
  // Bytes of one KV page of this session's layer, and what Configure reported (for metrics).
  int64_t page_bytes() const { return page_bytes_; }
  const v1::SessionCost& cost() const { return cost_; }
  int num_requests() const;
  // True once Close ran or was scheduled.
  bool closed() const { return closed_.load(std::memory_order_relaxed); }
  void MarkClosing() { closed_.store(true, std::memory_order_relaxed); }

 private:
  struct RequestState {
    SequenceId sequence = 0;
    int64_t length = 0;          // Tokens cached.
    int64_t last_position = -1;  // RoPE position of the last cached token.
    absl::Time last_used;
  };

  // KV bytes the engine holds for a request of `length` tokens: whole pages, less pages that a
  // sliding window has already evicted (mirrors the CPU layer's eviction rule).
  int64_t RequestKvBytes(int64_t length) const;
  void RefreshKvBytes();

  const std::string id_;
  const std::string label_;
  const LayerSpec spec_;
  const DType kv_dtype_;
  const SessionLimits limits_;
  const v1::SessionCost cost_;
  const int64_t page_size_;
  const int64_t page_bytes_;
  std::shared_ptr<SerialQueue> queue_;
  std::unique_ptr<AttentionLayer> layer_;  // Reset by Close, on the queue.
  std::atomic<int64_t> kv_bytes_used_{0};
  std::atomic<bool> closed_{false};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, RequestState> requests_ ABSL_GUARDED_BY(mu_);
  absl::Time last_used_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_H_

// A session: one attention layer (spec, weights, KV cache config) and the requests it serves.
// It is state, not policy: its SessionScheduler (server/session/scheduler.h) decides when and in
// which batches its methods run (both roads, Decode and Forward, go through the scheduler), and
// the gRPC service turns its plain results into messages. The session offers step-sized compute
// (one decode batch; one prefill chunk) and never calls the scheduler: the scheduler drives the
// chunk loop of a long Forward, so other work can run between two chunks. (scheduler.h includes
// this header, not the reverse.)
//
// Threading: the compute methods (Plan, RunDecode, StartPrefill, RunPrefillChunk, FinishPrefill,
// ReleaseRequest, Close, ExpireRequests) run only on the session's Strand, one at a time, so
// the engine layer is never entered concurrently and one request's steps apply in the order they
// arrived. The
// read-only methods (Snapshot, idle time, kv_bytes_used) may run on any thread; they take `mu_`
// only briefly and never wait on compute, so gRPC handlers can call them.
#ifndef ATTNSERVE_SERVER_SESSION_SESSION_H_
#define ATTNSERVE_SERVER_SESSION_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/core/tensor.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/kv/storage_format.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/stack/layer_stack.h"
#include "server/runtime/executor.h"
#include "server/session/parameter_budget.h"
#include "server/session/retained_outputs.h"

namespace attnserve::server {

class SessionScheduler;
struct SchedulerContext;

// Counters shown by GetSession (SessionInfo.batching), kept by the session's scheduler.
struct SchedulerCounters {
  int64_t decode_batches = 0;
  int64_t decode_steps = 0;
  int64_t max_decode_batch = 0;
  int64_t prefill_chunks = 0;
  int64_t batches_retried_alone = 0;
  int64_t decode_steps_waiting = 0;  // Steps queued for a batch now (a gauge, not a count).
};

struct SessionLimits {
  int max_requests = 0;
  int64_t max_sequence_length = 0;
};

// What a session's layer costs, as Configure reports it (SessionCost in the API).
struct SessionCost {
  int64_t parameter_count = 0;
  int64_t parameter_bytes = 0;     // As the layer holds them (AttentionLayer::ParameterBytes).
  int64_t kv_bytes_per_token = 0;  // Per request.
  int64_t page_bytes = 0;
  int64_t max_context_tokens = 0;  // The largest single context the free pool held at Configure.
};

// A session's state at one moment, for GetSession and ListSessions (server/rpc/session_info_codec.h
// turns it into a SessionInfo).
struct RequestSnapshot {
  std::string request_id;
  int64_t sequence_length = 0;  // Tokens cached.
  int64_t kv_bytes = 0;         // What its pages hold, as the layer reported.
  absl::Duration idle;
  int next_layer = 0;  // Model sessions: the layer its step in flight runs next (0: none).
};
struct SessionSnapshot {
  std::string id;
  std::string label;
  LayerSpec spec;
  DType kv_dtype = DType::kF32;
  KvQuantization kv_quantization = KvQuantization::kNone;  // 8-bit pages (kv_dtype unused).
  int64_t page_size = 0;
  SessionCost cost;
  int64_t kv_bytes_used = 0;
  SchedulerCounters batching;
  absl::Duration idle;
  std::vector<RequestSnapshot> requests;  // By request id; empty unless asked for.
  std::string fingerprint;                // server/session/layer_fingerprint.h; empty if never set.
  int num_layers = 1;                      // A hybrid stack's layers (kernels/stack/layer_stack.h).
  bool per_layer = false;                  // A model session: one layer per call.
  std::vector<LayerKindKv> kv_by_layer_kind;  // A stack's KV by layer kind; empty for one layer.
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

// What Session::Fork did: the length every fork starts with and the pool bytes the forks took.
struct ForkOutcome {
  int64_t sequence_length = 0;
  int64_t kv_bytes_added = 0;
};

// A request as ExportRequest sends it (Session::ExportRequest): its pages and where its RoPE
// positions stand.
struct RequestExport {
  SequenceExport kv;
  int64_t last_position = -1;  // RoPE position of its last cached token (-1: none).
};

// What Session::ImportRequest did.
struct ImportOutcome {
  int64_t sequence_length = 0;
  int64_t kv_bytes_added = 0;
};

// One call's inputs checked against the session's requests (Session::Plan): what the engine call
// needs and what to record once it succeeded.
struct StepPlan {
  struct Request {
    SequenceId sequence = 0;  // 0 until created, for a new request.
    bool is_new = false;
    int64_t length = 0;  // Tokens cached before this step.
  };
  bool decode = false;
  // Model sessions: the layer this call runs (0 for other sessions).
  int layer = 0;
  // Each input's positions are resolved: one per token (given, or continuing from the length).
  std::vector<StepInput> inputs;
  std::vector<Request> requests;  // One per input.
  // The call's idempotency key (empty = none); recorded on every request the call applies to,
  // with the digest of the call's inputs (call_digest.h) that a retry must match.
  std::string call_id;
  std::string input_digest;
  // True when `call_id` was already applied to every request of the call: nothing must run, and
  // `replayed` (one per input) answers the call from that call's retained results.
  bool replay = false;
  std::vector<StepOutput> replayed;
};

// A Forward plan split into engine Prefill calls of at most `chunk_tokens` rows
// (Session::StartPrefill), run one chunk per Session::RunPrefillChunk and recorded by
// Session::FinishPrefill. The scheduler owns it between chunks; it always ends the run with
// FinishPrefill or AbortPrefill. A chunked Forward's KV bytes are reserved up front by the layer
// (AttentionLayer::ReserveKv), held there by the plan's sequences, not by the run.
class PrefillRun {
 public:
  PrefillRun(const PrefillRun&) = delete;
  PrefillRun& operator=(const PrefillRun&) = delete;

  bool all_chunks_ran() const { return next_row_ >= total_rows_; }
  int64_t chunk_tokens() const { return chunk_tokens_; }  // Rows per engine call at most.
  int64_t rows_run() const { return next_row_; }
  int chunks_run() const { return chunks_run_; }
  int64_t compute_ns() const { return compute_ns_; }  // Engine time of the chunks run so far.
  int64_t total_rows() const { return total_rows_; }

 private:
  friend class Session;
  PrefillRun() = default;

  StepPlan plan_;
  DType dtype_ = DType::kF32;  // Of every input and output row.
  // Rows arrive with each chunk (Session::RunStreamedChunk) instead of in hidden_, and each
  // chunk's output goes back to the caller instead of into out_.
  bool streamed_ = false;
  Tensor hidden_;                   // Every row of the plan, inputs concatenated (not streamed).
  std::vector<int64_t> positions_;  // One per row, as the plan resolved them.
  std::vector<int64_t> row_start_;  // Input i's rows are [row_start_[i], row_start_[i + 1]).
  Tensor out_;
  std::vector<Tensor> results_;  // Session::AllocateOutputs: what FinishPrefill fills.
  int64_t chunk_tokens_ = 0;
  int64_t total_rows_ = 0;
  int64_t next_row_ = 0;  // First row of the next chunk.
  int chunks_run_ = 0;
  int64_t compute_ns_ = 0;
  bool reserved_ = false;  // Its sequences hold a reservation for its rows (ReserveKv).
  bool started_ = false;   // Its new requests' sequences exist.
  bool over_ = false;      // Undone (a chunk failed) or recorded (FinishPrefill).
};

// A session's cut for a drain (server/fleet/drain.h): once sealed, every call that would change
// its requests is refused UNAVAILABLE instead of applied, because the drain has listed the requests
// it moves and a change made here afterwards would never reach the peer (issue 21, items 5 and 6:
// a Forward queued at SIGTERM, or an ImportRequest whose pages came after it, answered OK for a
// request the peer never received). The drain seals a session in its turn on the session's queue,
// so the calls queued before it finish first and are moved with it. Part of the session's state,
// as `closed` is: every plan, Fork and import of the session checks it.
class DrainSeal {
 public:
  // Called with the number of requests a refused call named (for the drain's log and metric).
  using RefusalObserver = std::function<void(int64_t requests)>;

  // From now on Check fails with UNAVAILABLE `message`. Any thread; the first seal wins.
  void Seal(std::string message, RefusalObserver on_refused) ABSL_LOCKS_EXCLUDED(mu_);
  bool sealed() const { return sealed_.load(std::memory_order_acquire); }

  // OK while unsealed; once sealed, UNAVAILABLE with the seal's message, counting the call's
  // `requests` as refused.
  absl::Status Check(int64_t requests) ABSL_LOCKS_EXCLUDED(mu_);

  // Requests of the calls refused since the seal.
  int64_t refused_requests() const { return refused_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> sealed_{false};
  std::atomic<int64_t> refused_{0};
  mutable absl::Mutex mu_;
  std::string message_ ABSL_GUARDED_BY(mu_);
  RefusalObserver on_refused_ ABSL_GUARDED_BY(mu_);
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::string id, std::string label, const LayerSpec& spec, DType kv_dtype,
          SessionLimits limits, std::unique_ptr<AttentionLayer> layer, SessionCost cost,
          Executor* executor, SchedulerContext scheduler);
  // Gives back the retained outputs of requests still held.
  ~Session();

  // Where the outputs retained for call_id retries are kept and charged (retained_outputs.h):
  // `tenant`'s own bound applies when `tenant_bounded` (a non-admin tenant). Set once by
  // Configure, before the session is shared; until then a private store of
  // kDefaultRetainedOutputBytes.
  void SetRetainedOutputs(std::shared_ptr<RetainedOutputs> store, std::string tenant,
                          bool tenant_bounded);
  static constexpr int64_t kDefaultRetainedOutputBytes = int64_t{256} << 20;

  const std::string& id() const { return id_; }
  // The tenant that configured it (SetRetainedOutputs); "" with authentication off.
  const std::string& owner() const { return tenant_; }
  const LayerSpec& spec() const { return spec_; }
  Strand& queue() { return *queue_; }
  // Continuous batching of decode steps and ordering of the session's other work.
  SessionScheduler& scheduler() { return *scheduler_; }

  // ---- On the session's queue only -----------------------------------------------------------

  // Checks one call's inputs against the requests' state (existence, positions, limits) and
  // resolves their sequences, changing nothing. The plan stays valid until a step or release
  // touches one of its requests.
  // A non-empty `call_id` that was the last call applied to every input's request makes a replay
  // plan (see StepPlan::replay) when the inputs are that call's; other inputs under that call_id
  // are INVALID_ARGUMENT, and a call_id applied to some of the requests is FAILED_PRECONDITION.
  // Model sessions (SetModel): the call runs `layer`; layer 0 starts each input's step (with the
  // checks above), a layer k > 0 continues it and must be the layer its step runs next, with the
  // step's token count and positions (FAILED_PRECONDITION naming request and layers otherwise).
  absl::StatusOr<StepPlan> Plan(std::vector<StepInput> inputs, bool decode,
                                const std::string& call_id = "", int layer = 0);
  // A ForwardStream's plan, made before its rows arrive: inputs[i].hidden is an empty
  // [0, d_model] tensor of the call's dtype and `rows[i]` the rows it will have. Checked as Plan
  // checks a Forward without call_id; in addition every input must create a request
  // (ALREADY_EXISTS: rows appended to an existing request could not be taken back if the stream
  // failed), and a model session is FAILED_PRECONDITION (its calls are never chunked).
  absl::StatusOr<StepPlan> PlanStreamedForward(std::vector<StepInput> inputs,
                                               absl::Span<const int64_t> rows);
  // Any thread: INVALID_ARGUMENT unless `layer` is one this session takes (0 unless it is a model
  // session; [0, num_layers) for one).
  absl::Status CheckLayer(int layer) const;

  // One engine Decode call for several decode plans whose requests are all distinct (continuous
  // batching). All-or-nothing over every plan: on error no request changes. On success
  // `outputs[i]` answers plans[i]. `compute_ns` receives the engine time.
  absl::Status RunDecode(absl::Span<StepPlan* const> plans, int64_t* compute_ns,
                         std::vector<std::vector<StepOutput>>* outputs);

  // A Forward, step by step (the scheduler runs the loop, one chunk per turn on the queue):
  //   StartPrefill splits a Forward plan into engine Prefill calls of at most `chunk_tokens` rows
  //     (0 = one call; non-causal layers always run in one call, since a chunk could not see the
  //     rows after it), allocates what recording it needs, creates its new requests' sequences
  //     and, when it is chunked, has the layer reserve the KV bytes of the whole plan for its
  //     sequences (AttentionLayer::ReserveKv), which each chunk's pages then draw on, so a
  //     chunked Forward stays all-or-nothing against the pool even while other work runs between
  //     its chunks. On error nothing changed. May throw std::bad_alloc before changing anything.
  //   RunPrefillChunk runs the next chunk. On error (an allocation failure included) the run is
  //     undone (its new requests released, the reservation given back) and over.
  //   FinishPrefill, once all chunks ran, records the call on its requests and slices the outputs.
  //   AbortPrefill undoes a run that is neither over nor recorded (the caller gave up on it).
  // Between two chunks the plan's requests must not be touched by anything else (the scheduler
  // holds back their steps and later ops); other requests may run.
  absl::StatusOr<std::unique_ptr<PrefillRun>> StartPrefill(StepPlan plan, int64_t chunk_tokens);
  absl::Status RunPrefillChunk(PrefillRun& run);
  // The same for a ForwardStream (a plan from PlanStreamedForward), whose rows arrive while it
  // runs: StartStreamedPrefill always reserves the whole plan's KV bytes (a prompt that cannot fit
  // is refused before it is uploaded); RunStreamedChunk runs the next rows.dim(0) rows (at most
  // run.chunk_tokens() for an engine call of the planned size) and returns their output;
  // FinishPrefill records it (its outputs have zero rows) and AbortPrefill undoes it, freeing
  // every page it took: all its requests are new.
  absl::StatusOr<std::unique_ptr<PrefillRun>> StartStreamedPrefill(StepPlan plan,
                                                                   int64_t chunk_tokens);
  absl::StatusOr<Tensor> RunStreamedChunk(PrefillRun& run, const Tensor& rows);
  std::vector<StepOutput> FinishPrefill(PrefillRun& run);
  void AbortPrefill(PrefillRun& run);

  // Whether `request_id` exists now. Any thread.
  bool HasRequest(const std::string& request_id) const;
  // Tokens cached by `request_id` now; 0 if unknown. Any thread: the request state's copy of the
  // layer's count (AttentionLayer::SequenceLength, the one owner), refreshed after every call, so
  // readers off the queue neither enter the layer nor wait for its compute.
  int64_t RequestLength(const std::string& request_id) const;

  // Creates `new_ids` as forks of `source` (AttentionLayer::ForkSequence: its cached tokens shared
  // copy-on-write, positions continuing from its last one). NOT_FOUND for an unknown source;
  // INVALID_ARGUMENT for no new ids, an empty, repeated or existing one; RESOURCE_EXHAUSTED past
  // max_requests or when the pool cannot hold the partial-page copies. All or nothing.
  absl::StatusOr<ForkOutcome> Fork(const std::string& source,
                                   const std::vector<std::string>& new_ids);

  // Moving a request (server/session/session_transfer.cc). ExportRequest copies `request_id`'s
  // pages and positions (AttentionLayer::ExportSequence) and, when `release`, frees it in the same
  // step. NOT_FOUND for an unknown request.
  absl::StatusOr<RequestExport> ExportRequest(const std::string& request_id, bool release);
  // An import's first step, when its header arrives: a new, empty layer sequence that reserves
  // the KV bytes `num_tokens` imported tokens will hold (AttentionLayer::ReserveImport), so the
  // layer owns them from the start, as it owns a chunked Forward's. RESOURCE_EXHAUSTED ("this
  // import") when the budget cannot hold them, nothing left behind. The sequence is ImportRequest's
  // to fill, or AbandonImport's to release.
  absl::StatusOr<SequenceId> ReserveImport(int64_t num_tokens);
  // Creates `request_id` from an export of a session with this one's fingerprint, its pages in
  // `reserved` (from ReserveImport; drawing on its reservation). ALREADY_EXISTS for an existing
  // id; RESOURCE_EXHAUSTED past max_requests or when the pool cannot hold the pages; OUT_OF_RANGE
  // past max_sequence_length; INVALID_ARGUMENT when the bytes do not fit the layer. All or
  // nothing: on error `reserved` is released (the import is over), leaving no bytes behind.
  absl::StatusOr<ImportOutcome> ImportRequest(const std::string& request_id,
                                              const RequestExport& exported, SequenceId reserved);
  // Releases `reserved` (from ReserveImport) and its reservation: an import that ended before its
  // pages were all here.
  void AbandonImport(SequenceId reserved);

  // Frees one request's pages; returns the bytes freed. NOT_FOUND for an unknown request.
  absl::StatusOr<int64_t> ReleaseRequest(const std::string& request_id);

  // Frees every request and the layer (and returns its parameter charge); later steps get
  // NOT_FOUND. Returns the KV bytes freed.
  int64_t Close();

  // Keeps the layer's charge against the server's parameter budget until the layer is freed.
  void HoldParameters(ParameterCharge charge) { parameters_ = std::move(charge); }

  // Releases requests idle for longer than `ttl`; returns how many.
  int ExpireRequests(absl::Time now, absl::Duration ttl);

  // ---- Any thread ----------------------------------------------------------------------------

  // The session's state now; its requests too when `with_requests`.
  SessionSnapshot Snapshot(absl::Time now, bool with_requests) const;
  absl::Duration IdleTime(absl::Time now) const;
  int64_t kv_bytes_used() const { return kv_bytes_used_.load(std::memory_order_relaxed); }
  // Bytes of one KV page of this session's layer, and what Configure reported (for metrics).
  int64_t page_bytes() const { return page_bytes_; }
  const SessionCost& cost() const { return cost_; }
  const SessionLimits& limits() const { return limits_; }
  int64_t page_size() const { return page_size_; }  // Tokens per KV page.
  // How the layer stores KV pages.
  const KvStorageFormat& kv_storage() const { return kv_storage_; }
  // server/session/layer_fingerprint.h. Set once by Configure, before the session is shared.
  void SetFingerprint(std::string fingerprint) { fingerprint_ = std::move(fingerprint); }
  const std::string& fingerprint() const { return fingerprint_; }
  // The `variant` label of this session's metrics series (VariantLabel of its spec), derived once
  // by Configure before the session is shared, so no call derives it again.
  void SetVariantLabel(std::string label) { variant_label_ = std::move(label); }
  const std::string& variant_label() const { return variant_label_; }
  // The serialized v1::ConfigureRequest that re-creates this session on a peer (--drain_to; empty
  // when the server keeps none). Set once by Configure, before the session is shared.
  void SetConfigureRequest(std::string bytes) { configure_request_ = std::move(bytes); }
  const std::string& configure_request() const { return configure_request_; }
  // Taken over from a draining replica (server/fleet/session_rebalancer.h). Any thread.
  void MarkAdopted() { adopted_.store(true, std::memory_order_relaxed); }
  bool adopted() const { return adopted_.load(std::memory_order_relaxed); }
  // A hybrid stack's KV bytes by layer kind (LayerStack::kv_usage) and its depth. Set once by
  // Configure, before the session is shared; null for one layer.
  void SetStack(std::shared_ptr<const StackKvUsage> kv_usage, int num_layers) {
    stack_kv_ = std::move(kv_usage);
    num_layers_ = num_layers;
  }
  const std::shared_ptr<const StackKvUsage>& stack_kv() const { return stack_kv_; }
  // A model session (StackSpec.per_layer): `model` is the session's own layer, a LayerStack in
  // StackMode::kPerLayer; each call runs one of its layers. Set once by Configure with SetStack,
  // before the session is shared.
  void SetModel(LayerStack* model) {
    model_ = model;
    per_layer_ = model != nullptr;
  }
  bool per_layer() const { return per_layer_; }
  int num_layers() const { return num_layers_; }
  int num_requests() const;
  // The drain's cut (DrainSeal above): once sealed, Plan, Fork, ImportRequest,
  // ReleaseRequest, ExportRequest with release and RunPrefillChunk refuse UNAVAILABLE and
  // ExpireRequests keeps every request. Any thread.
  DrainSeal& drain_seal() { return drain_seal_; }
  // True once Close ran or was scheduled.
  bool closed() const { return closed_.load(std::memory_order_relaxed); }
  void MarkClosing() { closed_.store(true, std::memory_order_relaxed); }

 private:
  // ImportRequest's work; it releases `reserved` when this fails.
  absl::StatusOr<ImportOutcome> ImportReserved(const std::string& request_id,
                                               const RequestExport& exported, SequenceId reserved);

  struct RequestState {
    SequenceId sequence = 0;
    // Tokens cached: a copy of the layer's count (AttentionLayer::SequenceLength, the one owner),
    // written from it after every call that changes it, for readers off the queue; decisions on
    // the queue (Plan) ask the layer.
    int64_t length = 0;
    int64_t last_position = -1;  // RoPE position of the last cached token.
    int64_t kv_bytes = 0;        // Its pages' bytes, as the layer reported after its last call.
    absl::Time last_used;
    // Model sessions: the step in flight, started by a layer-0 call: the layer it runs next (0:
    // none in flight) and its positions, which every later layer of the step takes.
    int step_layer = 0;
    std::vector<int64_t> step_positions;
    // The call_id of the last call applied to this request and its output for this request,
    // retained so that a retry of that call is answered without appending twice. Empty (and no
    // output held) when the last call carried no call_id. last_input_digest is that call's
    // CallInputDigest: a retry must match it. last_output is the output's handle in
    // `retained_` (kNone when not kept; it may also have been evicted since).
    std::string last_call_id;
    std::string last_input_digest;
    uint64_t last_output = RetainedOutputs::kNone;
  };
  // Forgets `state`'s retained output and gives its bytes back. A request holds one only after a
  // call with a call_id, so a call without one leaves the store alone, as it leaves the digest
  // (call_digest.h) uncomputed: nothing of call_id retries runs for a call that names none.
  void DropRetained(RequestState& state) {
    if (state.last_output == RetainedOutputs::kNone) return;
    retained_->Release(state.last_output);
    state.last_output = RetainedOutputs::kNone;
  }
  // Fills plan.replay and plan.replayed when `call_id` was the last call applied to every
  // request of plan.inputs (true); false when to none of them; FAILED_PRECONDITION when to some;
  // INVALID_ARGUMENT when to all of them but with other inputs (plan.input_digest).
  absl::StatusOr<bool> FillReplayLocked(const std::string& call_id, StepPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Plan for a model session's call on a layer k > 0: each input continues its request's step.
  absl::StatusOr<StepPlan> ContinueStepLocked(std::vector<StepInput> inputs, StepPlan plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the session used and finds `request_id` for Fork, ExportRequest and ReleaseRequest:
  // NOT_FOUND naming it (clipped) and the session when it is not there.
  absl::StatusOr<RequestState*> UseRequestLocked(const std::string& request_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void RefreshKvBytes();
  // Undoes a prefill run whose chunk failed or whose session closed: new sequences released,
  // reservation returned; returns `status`.
  absl::Status UndoPrefill(PrefillRun& run, const absl::Status& status);
  // Gives back what the run's sequences still hold reserved in the layer (ReserveKv).
  void GiveBackReservation(PrefillRun& run);
  // Plan with row counts given apart from the inputs' tensors (`row_counts` empty: the tensors'
  // rows).
  absl::StatusOr<StepPlan> PlanRows(std::vector<StepInput> inputs, bool decode,
                                    const std::string& call_id, int layer,
                                    absl::Span<const int64_t> row_counts);
  absl::StatusOr<std::unique_ptr<PrefillRun>> StartPrefillRun(StepPlan plan, int64_t chunk_tokens,
                                                              bool streamed);
  // Runs rows [run.next_row_, end) of the run, read from `source` starting at its row
  // `source_row`; returns their output. On error the run is undone (see RunPrefillChunk).
  absl::StatusOr<Tensor> RunRows(PrefillRun& run, int64_t end, const Tensor& source,
                                 int64_t source_row);
  void EndPrefillLocked(const PrefillRun& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rows and (resolved) positions of `plan` concatenated, as one engine call takes them.
  absl::Status GatherRows(const StepPlan& plan, Tensor* hidden, std::vector<int64_t>* positions);
  // Records a successful engine call: lengths, positions, last use; slices `out` per input.
  // `outputs` (AllocateOutputs) receive the rows, one per input.
  std::vector<StepOutput> Commit(StepPlan& plan, const Tensor& out, int64_t first_row,
                                 absl::Time now, std::vector<Tensor> outputs);
  // One output tensor per input of `plan`, and room in requests_ for its new requests: what
  // Commit would otherwise allocate after the engine call. May throw std::bad_alloc.
  // `with_rows` false: zero-row outputs (a streamed Forward's, whose rows went to its caller).
  std::vector<Tensor> AllocateOutputs(const StepPlan& plan, DType dtype, bool with_rows = true);

  const std::string id_;
  const std::string label_;
  const LayerSpec spec_;
  const DType kv_dtype_;
  const SessionLimits limits_;
  const SessionCost cost_;
  const int64_t page_size_;
  const int64_t page_bytes_;
  const KvStorageFormat kv_storage_;
  std::string fingerprint_;
  std::string variant_label_;
  std::string configure_request_;
  std::atomic<bool> adopted_{false};
  std::shared_ptr<const StackKvUsage> stack_kv_;
  int num_layers_ = 1;
  LayerStack* model_ = nullptr;  // layer_, when it is a model session's; null otherwise. Queue.
  bool per_layer_ = false;       // model_ was set (read from any thread).
  std::shared_ptr<Strand> queue_;
  std::unique_ptr<AttentionLayer> layer_;  // Reset by Close, on the queue.
  ParameterCharge parameters_;             // Returned by Close, with the layer.
  std::unique_ptr<SessionScheduler> scheduler_;
  std::atomic<int64_t> kv_bytes_used_{0};
  std::atomic<bool> closed_{false};
  DrainSeal drain_seal_;

  std::shared_ptr<RetainedOutputs> retained_;
  std::string tenant_;
  bool tenant_bounded_ = false;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, RequestState> requests_ ABSL_GUARDED_BY(mu_);
  // Existing requests a PrefillRun is extending: ExpireRequests leaves them alone between chunks.
  absl::flat_hash_set<std::string> in_prefill_ ABSL_GUARDED_BY(mu_);
  absl::Time last_used_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_SESSION_H_

// The per-session scheduler: continuous batching of decode steps, the chunk loop of a long
// Forward, and ordering against the other work of the session (Release, Fork, moves).
//
// Every decode step of a session, whatever call or stream it came from, waits in one list here.
// A batch (one engine Decode call) takes waiting calls in arrival order, at most one step per
// request (a request's next step waits for the next batch, so its order is kept), a multi-item
// Decode call whole (it stays all-or-nothing), and in a model session only calls on one layer.
// A batch launches on the session's Strand when
//   - it is full: max_batch_size steps, or max_batch_tokens context tokens; or
//   - no stream is still coming back: every request a decode batch answered since the last launch
//     has its next step waiting (a lone client never waits); or
//   - none of those streams came back for a while: the gap since the answers went out, or since
//     the last of them came back, reached the longer of max_queue_delay and the engine time of
//     the batch that answered them (a stream that slow has stopped, or would have waited about
//     that long for the next batch anyway), and the streams have had, since the answers, the
//     time they took to come back before (the return wait: the last whole round's return time,
//     kept a while as the maximum, which a stream given up on raises by coming back later, at
//     most to kLateRounds rounds, and never more than kReturnWaitBatches of the gap rule's unit or 10 ms);
//     max_queue_delay 0 never waits.
// Waiting for the streams the previous batch answered, rather than launching with the steps that
// arrived while it ran, is what keeps C ready streams in one batch of C: launching early splits
// them into two cohorts that take turns, each batch about C/2. So a step may wait for the others
// of its batch: at most one such gap per stream still expected, in practice the spread of the
// streams' round trips. A request an op names (Release, Forward, ...) is not waited for: its
// next step waits for that op anyway; and an op flushes only the earlier steps it must follow
// (on its requests; every step for an op on all of them), so a re-prefill's Release and Forward
// leave the batch being formed to wait for its streams.
// Otherwise a TimerQueue deadline re-posts it; no thread sleeps. Both roads into the engine start
// here: SubmitDecode for decode steps, SubmitForward for a Forward.
//
// A Forward, like the session's other work (Release, Fork, ...), is an op (PostOp): it runs after
// every step on its requests that arrived before it (they are flushed first), steps of its requests that arrive
// after it wait until it is done, and ops run one after another in the order they were posted
// (an op whose turn comes while an earlier op is still running is held back and re-posted when
// that op is over). A Forward runs as engine Prefill calls of at most prefill_chunk_tokens rows,
// and this scheduler drives the loop (Session::StartPrefill / RunPrefillChunk / FinishPrefill):
// each chunk is one task on the session's queue, and the next chunk is posted to the back of the
// queue. So between two chunks the executor thread is given up: other sessions' tasks waiting on
// the executor run (a decode step waits about one chunk behind another session's long Forward,
// not the whole Forward), and so do this session's decode batches: one batch of the steps that may
// run (not on the Forward's requests) runs before every chunk after the first.
//
// A ForwardStream (server/rpc/forward_stream.h) is a resumable op (PostResumableOp): ordered as any
// op, but its rows arrive while it runs, so a turn that finds no chunk ready waits instead of
// being re-posted, and the stream's reactor resumes it (ResumeOp) when rows come. Between its turns,
// as between a Forward's chunks, the session's decode steps of other requests run.
//
// Failures stay with the calls they concern: a call whose plan is invalid (unknown request,
// position, length) fails alone before the batch runs; a cancelled call leaves the list before it
// runs; and when the engine rejects a batch of several calls (e.g. RESOURCE_EXHAUSTED: the batch's
// new pages do not fit), each call is retried alone, so only those that cannot run fail.
//
// Metrics hook (BatchObserver): called on the session's queue after every decode batch and every
// Forward, with the facts a histogram needs (see BatchStats). Keep it cheap: it runs on the
// compute path.
#ifndef ATTNSERVE_SERVER_SESSION_SCHEDULER_H_
#define ATTNSERVE_SERVER_SESSION_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/server_options.h"
#include "server/runtime/timer_queue.h"
#include "server/session/session.h"

namespace attnserve::server {

// RESOURCE_EXHAUSTED for a call whose memory could not be allocated (std::bad_alloc caught where
// the call's work runs); `what` names the call ("this Forward").
absl::Status OutOfMemoryError(absl::string_view what);

using SchedulerClock = std::chrono::steady_clock;

// How one call's steps were served.
struct StepTiming {
  int64_t queue_ns = 0;    // Arrival until its batch's compute started (a Forward: its turn).
  int64_t compute_ns = 0;  // Engine time of the batch that ran it (a Forward: of all its chunks).
  int batch_size = 0;      // Steps in that engine call (1 = ran alone); a Forward: its items.
  // False when a Forward ended before its turn came (cancelled while queued, or shutting down):
  // it was never started, and the other fields are 0.
  bool reached_turn = true;
};

// One Decode call (or one DecodeStream message): 1..n steps on distinct requests.
struct DecodeCall {
  std::vector<StepInput> inputs;  // Validated by the codec.
  std::string call_id;            // Idempotency key (DecodeRequest.call_id); empty = none.
  int layer = 0;  // Model sessions: the layer it runs; a batch holds calls on one layer only.
  SchedulerClock::time_point arrival = SchedulerClock::now();
  std::function<bool()> is_cancelled;  // Optional; checked before the call joins a batch.
  // Called exactly once, on an executor thread: the outputs in item order, or the call's error.
  std::function<void(absl::StatusOr<std::vector<StepOutput>>, const StepTiming&)> done;
};

// One Forward call: 1..n requests (new ones are created) each appended a chunk of tokens, all or
// nothing.
struct ForwardCall {
  // The requests it appends to: decode steps on them that arrive later wait until it finished.
  std::vector<std::string> request_ids;
  std::string call_id;  // Idempotency key (ForwardRequest.call_id); empty = none.
  int layer = 0;        // Model sessions: the layer it runs.
  SchedulerClock::time_point arrival = SchedulerClock::now();
  std::function<bool()> is_cancelled;  // Optional; checked when its turn comes.
  // Called once, on the session's queue, when its turn comes: the call's inputs, validated, or its
  // error. Decoding a long prompt is compute, so it runs there rather than on a gRPC thread.
  std::function<absl::StatusOr<std::vector<StepInput>>()> read_inputs;
  // Called exactly once: the outputs in item order, or the call's error.
  std::function<void(absl::StatusOr<std::vector<StepOutput>>, const StepTiming&)> done;
};

// What one engine call did, for metrics.
struct BatchStats {
  bool decode = true;          // false: a Forward (all its prefill chunks).
  int64_t size = 0;            // Sequences: decode steps, or Forward items.
  int64_t tokens = 0;          // New tokens (rows): = size for decode.
  int64_t context_tokens = 0;  // Decode: sum of each step's context length (new token included).
  int64_t calls = 0;           // Calls (or stream messages) served.
  int64_t chunks = 1;          // Forward: engine Prefill calls (> 1 when chunked).
  int64_t compute_ns = 0;      // Engine time.
  // Decode: for each call, arrival until the batch launched (the step's queue wait).
  std::vector<int64_t> queue_wait_ns;
  bool retried_alone = false;  // The engine rejected the batch; its calls were retried one by one.
};
using BatchObserver = std::function<void(const Session&, const BatchStats&)>;

// What a session's scheduler needs from the server.
struct SchedulerContext {
  SchedulerOptions options;
  TimerQueue* timer = nullptr;  // Must outlive every session.
  BatchObserver observer;       // Optional.
};

class SessionScheduler {
 public:
  // `session` owns this scheduler.
  SessionScheduler(Session* session, SchedulerContext context);

  const SchedulerOptions& options() const { return context_.options; }

  // Any thread. Queues the call's steps for the next batch that can take them.
  void SubmitDecode(std::unique_ptr<DecodeCall> call);

  // Any thread. Runs the Forward as an op (see PostOp) on request_ids: plans it against the
  // requests, answers a retry of an applied call_id from what it left, else prefills in chunks,
  // one chunk per turn on the session's queue (other work runs between them). An UNAVAILABLE
  // `done` when the server is shutting down.
  void SubmitForward(std::unique_ptr<ForwardCall> call);

  // Any thread. Posts `task` on the session's queue to run after every decode step on
  // `request_ids` (empty = every request) that arrived before it and after every op posted
  // before it; steps on `request_ids` that arrive later wait until it finished. False when the
  // executor refused it (shutting down): `task` was dropped.
  bool PostOp(std::vector<std::string> request_ids, std::function<void()> task);

  // Any thread. An op whose input arrives while it runs (a ForwardStream's rows): posted and
  // ordered as PostOp, but `turn` returns true when the op is over and false when it waits for
  // more input; it then runs again (on the queue, after one batch of the session's decode steps)
  // once ResumeOp is called; a ResumeOp while a turn runs, or before the first, counts too. Until
  // it is over, steps of `request_ids` and later ops wait, as for a Forward between chunks.
  // Returns the op's ticket, or 0 when the executor refused it (shutting down: `turn` dropped).
  uint64_t PostResumableOp(std::vector<std::string> request_ids, std::function<bool()> turn);
  // Any thread. Gives the op `ticket` (PostResumableOp) another turn. False when it is over, or
  // when the executor refused the turn (shutting down: the op is over, its turn dropped).
  bool ResumeOp(uint64_t ticket);

  // On the session's queue. A chunk of a Forward run by its own op (a ForwardStream) ran:
  // counted in prefill_chunks as SubmitForward's chunks are, as each runs (so GetSession shows a
  // long Forward's progress, which tests order events by).
  void CountPrefillChunk();

  // On the session's queue. A Forward run by its own op (a ForwardStream) is over: reported to
  // the BatchObserver as SubmitForward's are.
  void ObserveForward(const BatchStats& stats);

  SchedulerCounters counters() const;

 private:
  enum class State {
    kIdle,     // Nothing posted: the next SubmitDecode posts a batch task.
    kPosted,   // A batch task is queued on (or running in) the session's queue.
    kWaiting,  // A timer will post the batch task when the oldest step's delay is over.
  };
  struct Pending {
    uint64_t ticket = 0;
    std::unique_ptr<DecodeCall> call;
  };
  struct Selection {
    std::vector<size_t> taken;  // Indexes into pending_.
    int64_t steps = 0;
    int64_t context_tokens = 0;
    bool full = false;  // A call was left out for lack of room.
    SchedulerClock::time_point oldest;
  };
  using Completion = std::pair<std::unique_ptr<DecodeCall>, absl::Status>;
  // One turn of an op on the session's queue: kOver when the op is over, kAgain when it wants
  // another turn (posted to the back of the queue, so other work runs first), kWait when it
  // wants another once ResumeOp is called.
  enum class TurnResult { kOver, kAgain, kWait };
  using OpTurn = std::function<TurnResult()>;
  struct ForwardRun;

  // Chooses the next batch among pending calls with ticket < `before`; moves cancelled calls
  // to `cancelled`.
  Selection SelectLocked(uint64_t before, std::vector<Completion>* cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::unique_ptr<DecodeCall>> TakeLocked(const Selection& selection)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BlockedByOpLocked(const std::string& request_id, uint64_t ticket) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts the batch task; on refusal (shutdown) fails every pending call into `failed`.
  void PostBatchTaskLocked(std::vector<Completion>* failed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BatchTask();
  void OnTimer(uint64_t generation);
  // Runs the batch's calls in one engine call (retrying them alone if it fails) and answers them.
  void Execute(std::vector<std::unique_ptr<DecodeCall>> calls);
  // Just before `answers` (of a batch that took `compute_ns`) go out: their requests are
  // returning_ (those with no step waiting).
  void NoteAnswered(absl::Span<const std::vector<StepOutput>> answers, int64_t compute_ns);
  // Whether the op `ticket` must wait for earlier steps: those on its requests (any, for an op
  // on every request). Steps of other requests stay in the batch being formed.
  bool MustFlushBefore(uint64_t ticket);
  // Runs batches of every step that arrived before `ticket`.
  void FlushBefore(uint64_t ticket);
  // On the session's queue, inside an op: runs one batch of the decode steps that may run now,
  // whatever their wait (before every prefill chunk but the first).
  void RunBatchNow();
  // Posts an op; see PostOp.
  bool PostOpTurns(std::vector<std::string> request_ids, std::shared_ptr<OpTurn> turn,
                   uint64_t* posted_ticket = nullptr);
  // Posts turn `first` (or a later one) of the op `ticket`; false when the executor refused it.
  bool PostTurnLocked(uint64_t ticket, std::shared_ptr<OpTurn> turn, bool first)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one turn of op `ticket`, on the queue.
  void RunTurn(uint64_t ticket, const std::shared_ptr<OpTurn>& turn, bool first);
  // The op `ticket` is over: held-back steps and the next held-back op may run.
  void FinishOp(uint64_t ticket);
  // A Forward's turns, on the queue: the first plans it and runs its first chunk; each later one
  // runs the next chunk; the last records it and answers the call.
  TurnResult ForwardTurn(ForwardRun& forward);
  // ForwardTurn's work (true: the Forward is over); may throw std::bad_alloc.
  bool ComputeForwardTurn(ForwardRun& forward);
  static void Complete(std::vector<Completion>& completions);

  Session* const session_;
  const SchedulerContext context_;

  mutable absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Ops posted and not finished, by ticket: the requests they touch (empty = all).
  std::map<uint64_t, std::vector<std::string>> ops_ ABSL_GUARDED_BY(mu_);
  // Ops whose first turn came while an earlier op was still running, by ticket.
  std::map<uint64_t, std::shared_ptr<OpTurn>> held_ops_ ABSL_GUARDED_BY(mu_);
  // Resumable ops waiting for ResumeOp, and those resumed while a turn ran (or before the first).
  std::map<uint64_t, std::shared_ptr<OpTurn>> waiting_ops_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> resumed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  State state_ ABSL_GUARDED_BY(mu_) = State::kIdle;
  uint64_t timer_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Requests a decode batch answered since the last launch whose next step has not arrived: the
  // batch being formed waits for them (see the header) while they keep coming back.
  absl::flat_hash_set<std::string> returning_ ABSL_GUARDED_BY(mu_);
  SchedulerClock::time_point answered_at_ ABSL_GUARDED_BY(mu_);
  // The longest engine time of the batches that answered them.
  int64_t answered_batch_ns_ ABSL_GUARDED_BY(mu_) = 0;
  SchedulerClock::time_point last_return_ ABSL_GUARDED_BY(mu_);  // The last of them to arrive.
  // How long the last round took: the answers until every stream they answered was back.
  int64_t round_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // How long after the answers a batch waits for the streams still out (see the header): the
  // maximum of round_ns_ decaying by a quarter per round, raised by late streams.
  int64_t return_wait_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // The streams a batch gave up on (launched without) and when they were answered: one that comes
  // back before the next give-up tells how late a stream may be.
  absl::flat_hash_set<std::string> late_ ABSL_GUARDED_BY(mu_);
  SchedulerClock::time_point late_since_ ABSL_GUARDED_BY(mu_);
  // A late stream raises the return wait to at most this many whole rounds.
  static constexpr int64_t kLateRounds = 4;
  // The return wait never exceeds this many batch times (the gap rule's unit) or the floor if
  // longer: enough for answers that reach 64 client threads in bursts (3-14 ms against 1.5 ms MQA
  // batches), while a stream whose client thinks between steps delays the others by at most that.
  static constexpr int kReturnWaitBatches = 8;
  static constexpr std::chrono::milliseconds kReturnWaitFloor{10};

  std::atomic<int64_t> decode_batches_{0};
  std::atomic<int64_t> decode_steps_{0};
  std::atomic<int64_t> max_decode_batch_{0};
  std::atomic<int64_t> prefill_chunks_{0};
  std::atomic<int64_t> retried_alone_{0};
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_SCHEDULER_H_

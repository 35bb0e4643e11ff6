#include "server/rpc/forward_stream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention_service.pb.h"
#include "proto/codec/tensor_codec.h"
#include "server/observability/call_log.h"
#include "server/rpc/step_codec.h"
#include "server/rpc/wire_call.h"
#include "server/session/scheduler.h"
#include "server/session/session.h"

namespace attnserve::server {

namespace {

using Clock = std::chrono::steady_clock;

int64_t NanosBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
}

// Room left under the message limit for the framing around one message's rows.
constexpr int64_t kRowsHeadroomBytes = 1024;

class ForwardStreamReactor;

// A ForwardStream's idle watch (--forward_stream_idle_timeout), shared with the timer callbacks
// that check it. `reactor` is null once the call is done (OnDone clears it under `mu`, so a
// callback that holds `mu` uses a live reactor). Lock order: `mu`, then the reactor's mutex.
struct IdleWatch {
  absl::Mutex mu;
  ForwardStreamReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  // When the last message arrived (absl::Now() in nanoseconds); written without `mu`.
  std::atomic<int64_t> last_message_ns{absl::GetCurrentTimeNanos()};
};

class ForwardStreamReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ForwardStreamReactor(const TransferContext& context, grpc::CallbackServerContext* call)
      : context_(context), call_(call) {
    if (grpc::Status draining = context_.draining(); !draining.ok()) {
      EndBeforeOp(std::move(draining));
      return;
    }
    absl::StatusOr<Principal> caller = context_.authenticate(*call);
    if (!caller.ok()) {
      EndBeforeOp(ToGrpc(caller.status()));
      return;
    }
    caller_ = *std::move(caller);
    if (context_.timer != nullptr && context_.forward_stream_idle_timeout > absl::ZeroDuration()) {
      absl::MutexLock lock(&watch_->mu);
      watch_->reactor = this;
      ScheduleWatch(watch_, context_, absl::Now() + context_.forward_stream_idle_timeout);
    }
    absl::MutexLock lock(&mu_);
    reading_ = true;
    StartRead(&wire_in_);
  }

  void OnReadDone(bool ok) override {
    if (ok) watch_->last_message_ns.store(absl::GetCurrentTimeNanos());
    grpc::Status finish_with;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (!ending_) {
        if (!ok) {
          // The client half-closed (or the call broke).
          if (call_->IsCancelled()) {
            FailLocked(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled"));
          } else if (session_ == nullptr) {
            FailLocked(ToGrpc(absl::InvalidArgumentError(
                "the stream ended before its header (the first ForwardStreamRequest)")));
          } else if (received_rows_ < total_rows_) {
            FailLocked(ToGrpc(absl::InvalidArgumentError(absl::StrCat(
                "rows: the stream ended after ", received_rows_, " of the ", total_rows_,
                " rows the header announced; nothing was applied"))));
          }
          // Else every row is here: the op's turns end the call.
        } else {
          TakeMessageLocked();
          MaybeReadLocked();
        }
      }
      finish = TakeFinishLocked(&finish_with);
    }
    if (finish) Finish(std::move(finish_with));  // Last: OnDone may delete this at once.
  }

  void OnWriteDone(bool ok) override {
    grpc::Status finish_with;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      outbox_.pop_front();
      if (!ok) {
        outbox_.clear();
        // The client is gone: the op's next turn undoes the Forward and ends the call.
        FailLocked(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled"));
      }
      if (!outbox_.empty()) {
        StartWriteLocked();
      } else if (ending_ && !finished_) {
        finished_ = finish_pending_ = true;
      }
      finish = TakeFinishLocked(&finish_with);
    }
    if (finish) Finish(std::move(finish_with));
  }

  void OnCancel() override {
    grpc::Status finish_with;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      FailLocked(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled"));
      finish = TakeFinishLocked(&finish_with);
    }
    if (finish) Finish(std::move(finish_with));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&watch_->mu);
      watch_->reactor = nullptr;  // Timer callbacks are done with this call.
    }
    delete this;
  }

 private:
  // ---- The idle watch ----------------------------------------------------------------------------

  // Checks `watch` at `at`: ends its stream when it owes rows and no message came for the idle
  // timeout, else checks again when the timeout after its last message passes.
  static void ScheduleWatch(std::shared_ptr<IdleWatch> watch, const TransferContext& context,
                            absl::Time at) {
    context.timer->Schedule(at, [watch, &context] {
      absl::MutexLock lock(&watch->mu);
      if (watch->reactor == nullptr) return;
      const absl::Time due = absl::FromUnixNanos(watch->last_message_ns.load()) +
                             context.forward_stream_idle_timeout;
      if (absl::Now() < due) {
        ScheduleWatch(watch, context, due);
        return;
      }
      if (!watch->reactor->EndIdle()) watch->reactor = nullptr;  // Nothing more to watch.
    });
  }

  // The idle timeout passed since the last message. When the stream still owes its header or
  // rows, fails it DEADLINE_EXCEEDED (the op's next turn undoes the Forward, releasing every
  // request it created) and returns true; else (all rows here, or ending) false. Called with the
  // watch's mutex held; the read pending while rows are owed keeps OnDone from running inside
  // Finish here.
  bool EndIdle() {
    grpc::Status finish_with;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (ending_ || (session_ != nullptr && received_rows_ >= total_rows_)) return false;
      FailLocked(grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("ForwardStream: no message for ",
                       absl::FormatDuration(context_.forward_stream_idle_timeout),
                       " (--forward_stream_idle_timeout) with ",
                       session_ == nullptr
                           ? std::string("the header not yet sent")
                           : absl::StrCat(received_rows_, " of the ", total_rows_,
                                          " announced rows received"),
                       "; the Forward is abandoned and every request it created released")));
      finish = TakeFinishLocked(&finish_with);
    }
    if (finish) Finish(std::move(finish_with));
    return true;
  }

  // ---- Before the op: the header ---------------------------------------------------------------

  // Ends a call whose op was never posted (nothing to undo).
  void EndBeforeOp(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      ending_ = finished_ = true;
    }
    Report(status, 0);
    Finish(std::move(status));
  }

  // Handles one message; a bad one fails the call (see FailLocked).
  void TakeMessageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::ForwardStreamRequest message;
    if (!ParseMessage(wire_in_, &message)) {
      return FailLocked(UnparseableMessage(message, wire_in_.Length()));
    }
    wire_in_.Clear();
    if (session_ == nullptr) {
      if (!message.has_header()) {
        return FailLocked(ToGrpc(absl::InvalidArgumentError(
            "the first ForwardStreamRequest must carry the header, not rows")));
      }
      FailLocked(ToGrpc(TakeHeaderLocked(message.header())));
      return;
    }
    if (!message.has_rows()) {
      return FailLocked(ToGrpc(absl::InvalidArgumentError(
          "after the header, every ForwardStreamRequest must carry rows")));
    }
    const std::string& data = message.rows().data();
    if (data.empty() || data.size() % row_bytes_ != 0) {
      return FailLocked(ToGrpc(absl::InvalidArgumentError(absl::StrCat(
          "rows.data: has ", data.size(), " bytes, expected a whole number (>= 1) of rows of ",
          row_bytes_, " bytes (d_model ", d_model_, " x ", DTypeName(dtype_), ")"))));
    }
    const int64_t rows = static_cast<int64_t>(data.size() / row_bytes_);
    if (received_rows_ + rows > total_rows_) {
      return FailLocked(ToGrpc(absl::InvalidArgumentError(absl::StrCat(
          "rows: ", received_rows_ + rows, " rows sent, more than the ", total_rows_,
          " the header announced (sum of items[].num_tokens)"))));
    }
    received_rows_ += rows;
    inbox_.append(data);
    ResumeLocked();
  }

  // Checks the header against its session and posts the op. Cheap checks only: the session's
  // queue plans the call again against the requests' state in the op's first turn.
  absl::Status TakeHeaderLocked(const v1::ForwardStreamHeader& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (absl::Status s = CheckId(header.session_id(), "header.session_id", kMaxSessionIdBytes);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::shared_ptr<Session>> session =
        context_.registry->Find(header.session_id(), caller_);
    if (!session.ok()) return session.status();
    variant_ = (*session)->variant_label();
    absl::StatusOr<DType> dtype = DTypeFromProto(header.dtype(), "header.dtype");
    if (!dtype.ok()) return dtype.status();
    const LayerSpec& spec = (*session)->spec();
    if (header.d_model() != spec.d_model) {
      return absl::InvalidArgumentError(absl::StrCat("header.d_model = ", header.d_model(),
                                                     ", expected the session's d_model = ",
                                                     spec.d_model));
    }
    if (header.items_size() == 0) {
      return absl::InvalidArgumentError("header.items: must not be empty");
    }
    const int64_t max_length = (*session)->limits().max_sequence_length;
    absl::flat_hash_map<std::string, int> seen;
    for (int i = 0; i < header.items_size(); ++i) {
      const v1::ForwardStreamItem& item = header.items(i);
      const std::string field = absl::StrCat("header.items[", i, "]");
      if (absl::Status s = CheckId(item.request_id(), absl::StrCat(field, ".request_id"),
                                   kMaxRequestIdBytes);
          !s.ok()) {
        return s;
      }
      if (auto [it, inserted] = seen.emplace(item.request_id(), i); !inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".request_id: '", item.request_id(), "' repeats header.items[", it->second,
            "]; request ids in one call must be distinct"));
      }
      if (item.num_tokens() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".num_tokens = ", item.num_tokens(), ", must be >= 1"));
      }
      // Before the sum, so it cannot overflow (max_length is far below 2^63 / items).
      if (item.num_tokens() > max_length) {
        return absl::OutOfRangeError(absl::StrCat(
            field, ": request '", item.request_id(), "' would hold ", item.num_tokens(),
            " tokens, over max_sequence_length = ", max_length));
      }
      if (item.positions_size() != 0 && item.positions_size() != item.num_tokens()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".positions: has ", item.positions_size(),
                         " entries, expected one per token (", item.num_tokens(), ") or none"));
      }
      if ((*session)->HasRequest(item.request_id())) {
        return absl::AlreadyExistsError(absl::StrCat(
            field, ".request_id: request '", item.request_id(), "' already exists in session '",
            (*session)->id(), "'; ForwardStream creates new requests only (extend one with Forward)"));
      }
      StepInput input;
      input.request_id = item.request_id();
      input.hidden = Tensor(*dtype, {0, spec.d_model});  // The rows arrive later.
      input.positions.assign(item.positions().begin(), item.positions().end());
      inputs_.push_back(std::move(input));
      rows_.push_back(item.num_tokens());
      total_rows_ += item.num_tokens();
    }
    session_ = *std::move(session);
    dtype_ = *dtype;
    d_model_ = spec.d_model;
    row_bytes_ = static_cast<size_t>(spec.d_model) * DTypeSize(*dtype);
    std::vector<std::string> ids;
    for (const StepInput& in : inputs_) ids.push_back(in.request_id);
    // The turn takes mu_ itself, so it cannot run before ticket_ is set below.
    ticket_ = session_->scheduler().PostResumableOp(std::move(ids), [this] { return Turn(); });
    if (ticket_ == 0) return absl::UnavailableError("the server is shutting down");
    return absl::OkStatus();
  }

  // ---- The op's turns, on the session's queue ---------------------------------------------------

  // One turn: true when the call is over (answered or failed), false to wait for rows.
  bool Turn() {
    const bool over = TurnBody();
    grpc::Status finish_with;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      finish = TakeFinishLocked(&finish_with);
    }
    if (finish) Finish(std::move(finish_with));  // Last: OnDone may delete this at once.
    return over;
  }

  bool TurnBody() {
    if (!started_) {
      started_ = true;
      if (absl::Status s = StartRun(); !s.ok()) return EndOp(ToGrpc(s));
    }
    Tensor rows;
    {
      absl::MutexLock lock(&mu_);
      if (!failure_.ok()) return EndOpLocked(failure_);
      if (call_->IsCancelled()) {
        return EndOpLocked(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled"));
      }
      if (run_->all_chunks_ran()) return EndOpLocked(grpc::Status::OK);
      const int64_t waiting = static_cast<int64_t>(inbox_.size() / row_bytes_);
      const int64_t to_run = total_rows_ - run_->rows_run();
      const int64_t chunk = std::min(run_->chunk_tokens(), to_run);
      if (waiting < chunk) {
        MaybeReadLocked();
        return false;  // Resumed when more rows arrive.
      }
      rows = Tensor(dtype_, {chunk, d_model_});
      std::memcpy(rows.data(), inbox_.data(), rows.num_bytes());
      inbox_.erase(0, rows.num_bytes());
      MaybeReadLocked();
    }
    const std::string field =
        absl::StrCat("rows (", run_->rows_run(), "..", run_->rows_run() + rows.dim(0) - 1, ")");
    absl::Status valid = CheckFinite(rows, field);
    if (valid.ok()) valid = CheckMagnitude(rows, field, kMaxAbsHiddenValue);
    if (!valid.ok()) return EndOp(ToGrpc(valid));
    absl::StatusOr<Tensor> out = session_->RunStreamedChunk(*run_, rows);
    if (!out.ok()) return EndOp(ToGrpc(out.status()));  // The session undid the run.
    session_->scheduler().CountPrefillChunk();
    absl::MutexLock lock(&mu_);
    QueueRowsLocked(*out);
    // The next chunk (or the end) in a later turn: the session's decode steps run in between.
    ResumeLocked();
    return false;
  }

  // The op's first turn: plans the call and reserves its KV bytes.
  absl::Status StartRun() {
    {
      absl::MutexLock lock(&mu_);
      queue_ns_ = NanosBetween(arrival_, Clock::now());
      if (!failure_.ok()) return absl::Status(static_cast<absl::StatusCode>(failure_.error_code()),
                                              failure_.error_message());
    }
    try {
      absl::StatusOr<StepPlan> plan = session_->PlanStreamedForward(std::move(inputs_), rows_);
      if (!plan.ok()) return plan.status();
      absl::StatusOr<std::unique_ptr<PrefillRun>> run = session_->StartStreamedPrefill(
          *std::move(plan), session_->scheduler().options().prefill_chunk_tokens);
      if (!run.ok()) return run.status();
      absl::MutexLock lock(&mu_);
      run_ = *std::move(run);
    } catch (const std::bad_alloc&) {
      return OutOfMemoryError("this ForwardStream");
    }
    return absl::OkStatus();
  }

  bool EndOp(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    return EndOpLocked(std::move(status));
  }

  // Ends the op: records the Forward (OK) or undoes it, then ends the call once the queued
  // writes are out (on failure, at once after the write in flight). Always true (the op is over).
  bool EndOpLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t compute_ns = run_ != nullptr ? run_->compute_ns() : 0;
    if (status.ok()) {
      v1::ForwardStreamResponse last;
      v1::ForwardStreamSummary* summary = last.mutable_summary();
      const int64_t chunks = run_->chunks_run();
      std::vector<StepOutput> recorded = session_->FinishPrefill(*run_);
      for (size_t i = 0; i < recorded.size(); ++i) {
        v1::ForwardStreamResult* result = summary->add_results();
        result->set_request_id(recorded[i].request_id);
        result->set_num_tokens(rows_[i]);
        result->set_sequence_length(recorded[i].sequence_length);
      }
      summary->set_prefill_chunks(chunks);
      v1::Timing* timing = summary->mutable_timing();
      timing->set_queue_ns(queue_ns_);
      timing->set_compute_ns(compute_ns);
      timing->set_total_ns(NanosBetween(arrival_, Clock::now()));
      BatchStats stats;
      stats.decode = false;
      stats.size = stats.calls = static_cast<int64_t>(rows_.size());
      stats.tokens = total_rows_;
      stats.chunks = chunks;
      stats.compute_ns = compute_ns;
      session_->scheduler().ObserveForward(stats);
      QueueMessageLocked(last);
    } else if (run_ != nullptr) {
      session_->AbortPrefill(*run_);  // Releases its new requests and the reservation.
    }
    run_.reset();
    inbox_.clear();
    ending_ = true;
    final_status_ = status;
    Report(status, compute_ns);
    if (!status.ok()) {
      // What was not yet written is dropped; the one write in flight completes first.
      if (writing_) {
        outbox_.erase(outbox_.begin() + 1, outbox_.end());
      } else {
        outbox_.clear();
      }
    }
    if (!writing_ && !outbox_.empty()) StartWriteLocked();
    if (writing_ || finished_) return true;  // OnWriteDone ends the call.
    finished_ = finish_pending_ = true;
    return true;
  }

  // ---- Helpers -----------------------------------------------------------------------------------

  // Records a failure. Before the op was posted it ends the call (Finish pending); after, the
  // op's next turn undoes the Forward and ends the call.
  void FailLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (status.ok() || ending_) return;
    if (ticket_ == 0) {
      ending_ = true;
      final_status_ = status;
      Report(status, 0);
      outbox_.clear();
      if (!writing_) finished_ = finish_pending_ = true;
      return;
    }
    if (failure_.ok()) failure_ = std::move(status);
    ResumeLocked();
  }

  // Whether an entry point must call Finish(*status) once it has released the lock.
  bool TakeFinishLocked(grpc::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!finish_pending_) return false;
    finish_pending_ = false;
    *status = final_status_;
    return true;
  }

  // Gives the op another turn. When it is already over (the executor refused a turn while the
  // server shuts down), ends the call here: the run is dropped with the reactor, which returns its
  // reservation.
  void ResumeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ticket_ == 0 || ending_) return;
    if (session_->scheduler().ResumeOp(ticket_)) return;
    ending_ = true;
    final_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
    Report(final_status_, 0);
    if (writing_) {
      outbox_.erase(outbox_.begin() + 1, outbox_.end());
    } else {
      outbox_.clear();
    }
    if (!writing_ && !finished_) finished_ = finish_pending_ = true;
  }

  // Reads the next message unless one is pending or the call is ending. Rows are read as they
  // arrive, not held back until their chunk runs: bytes left waiting in gRPC's buffers count
  // against the server's in-flight quota (--max_inflight_message_bytes), past which gRPC resets
  // streams, while the inbox holds no more than the unary Forward of the same rows would.
  void MaybeReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reading_ || ending_ || session_ == nullptr) return;
    // Past the last row one more read learns the half-close (or a message too many).
    if (received_rows_ >= total_rows_ && read_past_end_) return;
    if (received_rows_ >= total_rows_) read_past_end_ = true;
    reading_ = true;
    StartRead(&wire_in_);
  }

  // Queues `out`'s rows as messages of whole rows, a quarter of the message limit each: what
  // gRPC holds to send counts against the in-flight quota (at least 4 x the limit by default) too.
  void QueueRowsLocked(const Tensor& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t per_message = std::max<int64_t>(
        1, (context_.max_message_bytes / 4 - kRowsHeadroomBytes) / static_cast<int64_t>(row_bytes_));
    for (int64_t row = 0; row < out.dim(0); row += per_message) {
      const int64_t n = std::min(per_message, out.dim(0) - row);
      v1::ForwardStreamResponse message;
      message.mutable_rows()->set_data(
          reinterpret_cast<const char*>(out.data()) + static_cast<size_t>(row) * row_bytes_,
          static_cast<size_t>(n) * row_bytes_);
      QueueMessageLocked(message);
    }
  }

  void QueueMessageLocked(const v1::ForwardStreamResponse& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    grpc::ByteBuffer buffer;
    // Sized under the limit by construction; serialized without a second size check.
    SerializeMessage(message, INT64_MAX, &buffer).IgnoreError();
    outbox_.push_back(std::move(buffer));
    if (!writing_) StartWriteLocked();
  }

  void StartWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    StartWrite(&outbox_.front());
  }

  void Report(const grpc::Status& status, int64_t compute_ns) {
    RpcTiming timing;
    timing.computed = compute_ns > 0;
    timing.queue_seconds = static_cast<double>(queue_ns_) * 1e-9;
    timing.compute_seconds = static_cast<double>(compute_ns) * 1e-9;
    timing.total_seconds = std::chrono::duration<double>(Clock::now() - arrival_).count();
    ObserveCall(*context_.metrics, Rpc::kForwardStream, variant_, status, timing);
    if (!status.ok()) {
      LogFailedCall(RpcLabel(Rpc::kForwardStream), call_->peer(),
                    static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    }
  }

  const TransferContext& context_;
  grpc::CallbackServerContext* const call_;
  const std::shared_ptr<IdleWatch> watch_ = std::make_shared<IdleWatch>();
  const Clock::time_point arrival_ = Clock::now();
  Principal caller_;
  std::string variant_ = kNoVariant;

  // Set by the header, then read-only.
  std::shared_ptr<Session> session_;
  DType dtype_ = DType::kF32;
  int64_t d_model_ = 0;
  size_t row_bytes_ = 0;
  std::vector<int64_t> rows_;     // Per item.
  int64_t total_rows_ = 0;
  // Moved into the plan by the first turn.
  std::vector<StepInput> inputs_;
  bool started_ = false;  // On the queue only.

  absl::Mutex mu_;
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;  // The op; 0 until posted.
  std::unique_ptr<PrefillRun> run_;           // Its turns' (set under mu_, used on the queue).
  int64_t queue_ns_ = 0;
  grpc::ByteBuffer wire_in_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool read_past_end_ ABSL_GUARDED_BY(mu_) = false;
  int64_t received_rows_ ABSL_GUARDED_BY(mu_) = 0;
  std::string inbox_ ABSL_GUARDED_BY(mu_);  // Rows received and not yet run.
  std::deque<grpc::ByteBuffer> outbox_ ABSL_GUARDED_BY(mu_);  // front() is being written.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status failure_ ABSL_GUARDED_BY(mu_);  // For the op's next turn to end the call with.
  bool ending_ ABSL_GUARDED_BY(mu_) = false;   // The call's end is decided.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish was (or is about to be) called.
  bool finish_pending_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartForwardStream(
    const TransferContext& context, grpc::CallbackServerContext* call) {
  return new ForwardStreamReactor(context, call);
}

}  // namespace attnserve::server

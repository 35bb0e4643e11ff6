#include "server/session/scheduler.h"

#include <algorithm>
#include <new>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/session/session.h"

namespace attnserve::server {

absl::Status OutOfMemoryError(absl::string_view what) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "out of memory: ", what, " could not allocate what it needs (the process's memory limit is "
      "reached); it changed nothing, retry later or with fewer tokens"));
}

namespace {

int64_t NanosBetween(SchedulerClock::time_point from, SchedulerClock::time_point to) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
}

// RunDecode with an allocation failure as its error (the session changed nothing: see
// Session::RunDecode).
absl::Status RunDecodeOrOutOfMemory(Session& session, absl::Span<StepPlan* const> plans,
                                    int64_t* compute_ns,
                                    std::vector<std::vector<StepOutput>>* outputs) {
  try {
    return session.RunDecode(plans, compute_ns, outputs);
  } catch (const std::bad_alloc&) {
    return OutOfMemoryError("this Decode batch");
  }
}

absl::Status ShuttingDownError() { return absl::UnavailableError("the server is shutting down"); }

void RaiseMax(std::atomic<int64_t>& max, int64_t value) {
  int64_t seen = max.load(std::memory_order_relaxed);
  while (value > seen && !max.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

SessionScheduler::SessionScheduler(Session* session, SchedulerContext context)
    : session_(session), context_(std::move(context)) {}

void SessionScheduler::Complete(std::vector<Completion>& completions) {
  for (auto& [call, status] : completions) call->done(status, StepTiming{});
  completions.clear();
}

void SessionScheduler::SubmitDecode(std::unique_ptr<DecodeCall> call) {
  std::vector<Completion> failed;
  {
    absl::MutexLock lock(&mu_);
    const bool awaited = !returning_.empty();
    for (const StepInput& in : call->inputs) {
      if (returning_.erase(in.request_id) > 0) last_return_ = call->arrival;
      if (late_.erase(in.request_id) > 0) {
        // A stream given up on is back: a later round waits about that long for such a stream,
        // though at most kLateRounds of the last whole round (a client that paused is no measure).
        const int64_t late_ns = NanosBetween(late_since_, call->arrival);
        return_wait_ns_ = std::max(return_wait_ns_, std::min(late_ns, kLateRounds * round_ns_));
      }
    }
    if (awaited && returning_.empty()) {
      // Every stream the last batches answered is back: how long that round took. The wait
      // follows it down a quarter per round, and up at once.
      round_ns_ = NanosBetween(answered_at_, call->arrival);
      return_wait_ns_ = std::max(round_ns_, return_wait_ns_ - return_wait_ns_ / 4);
    }
    pending_.push_back({next_ticket_++, std::move(call)});
    if (state_ == State::kIdle) {
      state_ = State::kPosted;
      PostBatchTaskLocked(&failed);
    } else if (state_ == State::kWaiting) {
      // Waiting for the streams the last batch answered: launch once they are all back, or once
      // the batch would be full anyway.
      if (returning_.empty() ||
          static_cast<int64_t>(pending_.size()) >= context_.options.max_batch_size) {
        state_ = State::kPosted;
        ++timer_generation_;  // The armed timer finds itself stale.
        PostBatchTaskLocked(&failed);
      }
    }
  }
  Complete(failed);
}

void SessionScheduler::PostBatchTaskLocked(std::vector<Completion>* failed) {
  std::shared_ptr<Session> keep = session_->shared_from_this();
  if (session_->queue().Post([this, keep] { BatchTask(); })) return;
  state_ = State::kIdle;
  for (Pending& p : pending_) failed->emplace_back(std::move(p.call), ShuttingDownError());
  pending_.clear();
}

bool SessionScheduler::PostOp(std::vector<std::string> request_ids, std::function<void()> task) {
  auto turn = std::make_shared<OpTurn>([task = std::move(task)] {
    task();
    return TurnResult::kOver;
  });
  return PostOpTurns(std::move(request_ids), std::move(turn));
}

uint64_t SessionScheduler::PostResumableOp(std::vector<std::string> request_ids,
                                           std::function<bool()> turn) {
  auto op = std::make_shared<OpTurn>([turn = std::move(turn)] {
    return turn() ? TurnResult::kOver : TurnResult::kWait;
  });
  uint64_t ticket = 0;
  if (!PostOpTurns(std::move(request_ids), std::move(op), &ticket)) return 0;
  return ticket;
}

bool SessionScheduler::ResumeOp(uint64_t ticket) {
  std::shared_ptr<OpTurn> dropped;  // Destroyed after unlocking.
  {
    absl::MutexLock lock(&mu_);
    if (!ops_.contains(ticket)) return false;
    auto waiting = waiting_ops_.find(ticket);
    if (waiting == waiting_ops_.end()) {
      // Running, or not yet run: it takes another turn when this one is over.
      resumed_.insert(ticket);
      return true;
    }
    std::shared_ptr<OpTurn> turn = std::move(waiting->second);
    waiting_ops_.erase(waiting);
    if (PostTurnLocked(ticket, turn, /*first=*/false)) return true;
    dropped = std::move(turn);
  }
  FinishOp(ticket);
  return false;
}

bool SessionScheduler::PostOpTurns(std::vector<std::string> request_ids,
                                   std::shared_ptr<OpTurn> turn, uint64_t* posted_ticket) {
  std::vector<Completion> failed;
  bool posted = false;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t ticket = next_ticket_++;
    if (posted_ticket != nullptr) *posted_ticket = ticket;
    // The op's requests step again only after it: a batch being formed does not wait for them
    // (an empty list, every request, leaves nothing to wait for).
    if (request_ids.empty()) {
      returning_.clear();
    } else {
      for (const std::string& id : request_ids) returning_.erase(id);
    }
    // Those were the last streams the batch being formed waited for (a re-prefill's Release of
    // a stream that just got its last step): it launches now, ahead of the op, instead of at
    // its give-up time.
    if (state_ == State::kWaiting && returning_.empty()) {
      state_ = State::kPosted;
      ++timer_generation_;  // The armed timer finds itself stale.
      PostBatchTaskLocked(&failed);
    }
    ops_.emplace(ticket, std::move(request_ids));
    posted = PostTurnLocked(ticket, std::move(turn), /*first=*/true);
    if (!posted) ops_.erase(ticket);
  }
  Complete(failed);
  return posted;
}

bool SessionScheduler::PostTurnLocked(uint64_t ticket, std::shared_ptr<OpTurn> turn, bool first) {
  std::shared_ptr<Session> keep = session_->shared_from_this();
  return session_->queue().Post([this, keep, ticket, turn = std::move(turn), first] {
    RunTurn(ticket, turn, first);
  });
}

void SessionScheduler::RunTurn(uint64_t ticket, const std::shared_ptr<OpTurn>& turn, bool first) {
  if (first) {
    {
      absl::MutexLock lock(&mu_);
      // Ops run one after another: an earlier op (a Forward between two chunks) is not over yet,
      // so this one waits for it (FinishOp posts it again).
      if (ops_.begin()->first != ticket) {
        held_ops_.emplace(ticket, turn);
        return;
      }
    }
    // Only steps the op must follow run first: flushing every earlier step would launch the
    // batch being formed without the streams it waits for (each re-prefill's Release and Forward
    // would cut a batch of C streams in two).
    if (MustFlushBefore(ticket)) FlushBefore(ticket);
  } else {
    // Between two turns of an op (two prefill chunks): one batch of the session's decode steps
    // that may run now (those of the op's requests that arrived after it wait).
    RunBatchNow();
  }
  const TurnResult result = (*turn)();
  if (result == TurnResult::kAgain) {
    // Another turn, at the back of the queue: other sessions' work on the executor and this
    // session's work posted meanwhile run first.
    absl::MutexLock lock(&mu_);
    if (PostTurnLocked(ticket, turn, /*first=*/false)) return;
  } else if (result == TurnResult::kWait) {
    absl::MutexLock lock(&mu_);
    if (resumed_.erase(ticket) == 0) {
      waiting_ops_.emplace(ticket, turn);  // ResumeOp posts its next turn.
      return;
    }
    if (PostTurnLocked(ticket, turn, /*first=*/false)) return;
  }
  FinishOp(ticket);
}

void SessionScheduler::FinishOp(uint64_t ticket) {
  std::vector<Completion> failed;
  std::vector<std::shared_ptr<OpTurn>> dropped;  // Destroyed after unlocking.
  {
    absl::MutexLock lock(&mu_);
    ops_.erase(ticket);
    resumed_.erase(ticket);
    if (auto waiting = waiting_ops_.find(ticket); waiting != waiting_ops_.end()) {
      dropped.push_back(std::move(waiting->second));
      waiting_ops_.erase(waiting);
    }
    // The next op, if its turn already came and it was held back, goes now.
    while (!ops_.empty()) {
      auto held = held_ops_.find(ops_.begin()->first);
      if (held == held_ops_.end()) break;
      const uint64_t next = held->first;
      std::shared_ptr<OpTurn> turn = std::move(held->second);
      held_ops_.erase(held);
      if (PostTurnLocked(next, turn, /*first=*/true)) break;
      ops_.erase(next);  // Refused (shutting down): dropped.
      dropped.push_back(std::move(turn));
    }
    // Steps this op held back may run now.
    if (state_ == State::kIdle && !pending_.empty()) {
      state_ = State::kPosted;
      PostBatchTaskLocked(&failed);
    }
  }
  Complete(failed);
}

bool SessionScheduler::MustFlushBefore(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto op = ops_.find(ticket);
  if (op == ops_.end()) return true;
  const std::vector<std::string>& ids = op->second;
  for (const Pending& p : pending_) {
    if (p.ticket >= ticket) break;
    if (p.call == nullptr) continue;
    if (ids.empty()) return true;  // An op on every request follows every earlier step.
    for (const StepInput& in : p.call->inputs) {
      if (std::find(ids.begin(), ids.end(), in.request_id) != ids.end()) return true;
    }
  }
  return false;
}

bool SessionScheduler::BlockedByOpLocked(const std::string& request_id, uint64_t ticket) const {
  for (const auto& [op_ticket, ids] : ops_) {
    if (op_ticket >= ticket) break;
    if (ids.empty() || std::find(ids.begin(), ids.end(), request_id) != ids.end()) return true;
  }
  return false;
}

SessionScheduler::Selection SessionScheduler::SelectLocked(uint64_t before,
                                                           std::vector<Completion>* cancelled) {
  Selection s;
  absl::flat_hash_set<std::string> in_batch;
  absl::flat_hash_set<std::string> held;  // Requests with an earlier step not in this batch.
  bool have_dtype = false;
  DType dtype = DType::kF32;
  int layer = 0;  // Model sessions: one engine call runs one layer.
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    if (p.ticket >= before) break;
    if (p.call == nullptr) continue;
    if (p.call->is_cancelled && p.call->is_cancelled()) {
      cancelled->emplace_back(std::move(p.call), absl::CancelledError("call cancelled"));
      continue;
    }
    const std::vector<StepInput>& inputs = p.call->inputs;
    bool blocked = have_dtype && (inputs[0].hidden.dtype() != dtype || p.call->layer != layer);
    for (const StepInput& in : inputs) {
      blocked = blocked || in_batch.contains(in.request_id) || held.contains(in.request_id) ||
                BlockedByOpLocked(in.request_id, p.ticket);
    }
    int64_t context = 0;
    for (const StepInput& in : inputs) context += session_->RequestLength(in.request_id) + 1;
    const int64_t steps = static_cast<int64_t>(inputs.size());
    if (!blocked && !s.taken.empty() &&
        (s.steps + steps > context_.options.max_batch_size ||
         s.context_tokens + context > context_.options.max_batch_tokens)) {
      s.full = true;
      blocked = true;
    }
    if (blocked) {
      for (const StepInput& in : inputs) held.insert(in.request_id);
      if (s.full) break;  // First come, first served: nothing overtakes a call left out for room.
      continue;
    }
    if (s.taken.empty()) {
      s.oldest = p.call->arrival;
      dtype = inputs[0].hidden.dtype();
      layer = p.call->layer;
      have_dtype = true;
    }
    s.oldest = std::min(s.oldest, p.call->arrival);
    s.taken.push_back(i);
    s.steps += steps;
    s.context_tokens += context;
    for (const StepInput& in : inputs) in_batch.insert(in.request_id);
  }
  // Drop the entries cancelled calls left behind (after the loop: indexes stay valid).
  if (!cancelled->empty()) {
    std::deque<Pending> kept;
    std::vector<size_t> taken;
    for (size_t i = 0, t = 0; i < pending_.size(); ++i) {
      const bool is_taken = t < s.taken.size() && s.taken[t] == i;
      if (is_taken) ++t;
      if (pending_[i].call == nullptr) continue;
      if (is_taken) taken.push_back(kept.size());
      kept.push_back(std::move(pending_[i]));
    }
    pending_ = std::move(kept);
    s.taken = std::move(taken);
  }
  return s;
}

std::vector<std::unique_ptr<DecodeCall>> SessionScheduler::TakeLocked(const Selection& selection) {
  std::vector<std::unique_ptr<DecodeCall>> calls;
  for (size_t i : selection.taken) calls.push_back(std::move(pending_[i].call));
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const Pending& p) { return p.call == nullptr; }),
                 pending_.end());
  return calls;
}

void SessionScheduler::BatchTask() {
  std::vector<Completion> done;
  std::vector<std::unique_ptr<DecodeCall>> batch;
  {
    absl::MutexLock lock(&mu_);
    Selection s = SelectLocked(UINT64_MAX, &done);
    if (s.taken.empty()) {
      // Nothing may run now (or everything was cancelled): the op holding steps back reposts.
      state_ = State::kIdle;
    } else {
      const SchedulerClock::time_point now = SchedulerClock::now();
      const SchedulerOptions& o = context_.options;
      // While the streams the last batch answered keep coming back, each within one batch time
      // (at least max_queue_delay) of the one before, the batch waits for the rest: one left out
      // would wait for the next batch about that long anyway, and would start a second cohort.
      // And until they have had the time the streams took to come back in the rounds before:
      // answers reach many client threads in bursts, with pauses longer than a batch between
      // them (64 MQA streams on 2 loaded cores: 3-14 ms to return, pauses of 1.4-8 ms between
      // bursts, batches of 1.5 ms).
      // The return wait is capped (kReturnWaitBatches batch times, at least max_queue_delay
      // each, or kReturnWaitFloor if longer): a round's return time also counts a client's think
      // time between two steps, which would otherwise hold every other stream's step that long.
      const SchedulerClock::duration gap =
          std::max<SchedulerClock::duration>(absl::ToChronoNanoseconds(o.max_queue_delay),
                                             std::chrono::nanoseconds(answered_batch_ns_));
      const SchedulerClock::duration return_wait =
          std::min<SchedulerClock::duration>(
              std::chrono::nanoseconds(return_wait_ns_),
              std::max<SchedulerClock::duration>(kReturnWaitBatches * gap, kReturnWaitFloor));
      const SchedulerClock::time_point give_up =
          std::max(std::max(answered_at_, last_return_) + gap, answered_at_ + return_wait);
      const bool ready = s.full || s.steps >= o.max_batch_size ||
                         s.context_tokens >= o.max_batch_tokens || returning_.empty() ||
                         now >= give_up || o.max_queue_delay == absl::ZeroDuration() ||
                         context_.timer == nullptr;
      if (!ready) {
        state_ = State::kWaiting;
        const uint64_t generation = ++timer_generation_;
        const absl::Time deadline = absl::Now() + absl::Nanoseconds(NanosBetween(now, give_up));
        std::shared_ptr<Session> keep = session_->shared_from_this();
        context_.timer->Schedule(deadline, [this, keep, generation] { OnTimer(generation); });
      } else {
        batch = TakeLocked(s);
        if (!returning_.empty()) {  // Those not back yet join a later batch.
          late_ = std::move(returning_);
          late_since_ = answered_at_;
          returning_.clear();
        }
        answered_batch_ns_ = 0;
      }
    }
  }
  Complete(done);
  if (batch.empty()) return;
  Execute(std::move(batch));
  std::vector<Completion> failed;
  {
    absl::MutexLock lock(&mu_);
    if (pending_.empty()) {
      state_ = State::kIdle;
    } else {
      // Another turn on the queue (state stays kPosted): other work of the session and other
      // sessions get the executor in between.
      PostBatchTaskLocked(&failed);
    }
  }
  Complete(failed);
}

void SessionScheduler::OnTimer(uint64_t generation) {
  std::vector<Completion> failed;
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kWaiting || generation != timer_generation_) return;
    state_ = State::kPosted;
    PostBatchTaskLocked(&failed);
  }
  Complete(failed);
}

void SessionScheduler::RunBatchNow() {
  std::vector<Completion> done;
  std::vector<std::unique_ptr<DecodeCall>> batch;
  {
    absl::MutexLock lock(&mu_);
    batch = TakeLocked(SelectLocked(UINT64_MAX, &done));
  }
  Complete(done);
  if (!batch.empty()) Execute(std::move(batch));
}

void SessionScheduler::FlushBefore(uint64_t ticket) {
  while (true) {
    std::vector<Completion> done;
    std::vector<std::unique_ptr<DecodeCall>> batch;
    {
      absl::MutexLock lock(&mu_);
      batch = TakeLocked(SelectLocked(ticket, &done));
    }
    Complete(done);
    if (batch.empty()) return;
    Execute(std::move(batch));
  }
}

void SessionScheduler::Execute(std::vector<std::unique_ptr<DecodeCall>> calls) {
  const SchedulerClock::time_point start = SchedulerClock::now();
  BatchStats stats;
  stats.decode = true;
  // Plan each call against the requests' state; an invalid call fails alone.
  std::vector<StepPlan> plans;
  std::vector<std::unique_ptr<DecodeCall>> planned;
  plans.reserve(calls.size());
  for (std::unique_ptr<DecodeCall>& call : calls) {
    stats.queue_wait_ns.push_back(NanosBetween(call->arrival, start));
    for (const StepInput& in : call->inputs) {
      stats.context_tokens += session_->RequestLength(in.request_id) + 1;
    }
    absl::StatusOr<StepPlan> plan = OutOfMemoryError("this Decode call");
    try {
      plan = session_->Plan(std::move(call->inputs), /*decode=*/true, call->call_id, call->layer);
    } catch (const std::bad_alloc&) {
    }
    if (!plan.ok()) {
      call->done(plan.status(), StepTiming{NanosBetween(call->arrival, start), 0, 0});
      continue;
    }
    if (plan->replay) {  // A retry of a call already applied: answered, nothing runs.
      call->done(std::move(plan->replayed), StepTiming{NanosBetween(call->arrival, start), 0, 0});
      continue;
    }
    plans.push_back(*std::move(plan));
    planned.push_back(std::move(call));
  }
  if (planned.empty()) return;

  std::vector<StepPlan*> pointers;
  int64_t steps = 0;
  for (StepPlan& plan : plans) {
    pointers.push_back(&plan);
    steps += static_cast<int64_t>(plan.inputs.size());
  }
  std::vector<std::vector<StepOutput>> outputs;
  int64_t compute_ns = 0;
  absl::Status status = RunDecodeOrOutOfMemory(*session_, pointers, &compute_ns, &outputs);
  stats.size = stats.tokens = steps;
  stats.calls = static_cast<int64_t>(planned.size());
  stats.compute_ns = compute_ns;
  if (status.ok()) {
    NoteAnswered(outputs, compute_ns);
    for (size_t i = 0; i < planned.size(); ++i) {
      planned[i]->done(std::move(outputs[i]), StepTiming{NanosBetween(planned[i]->arrival, start),
                                                         compute_ns, static_cast<int>(steps)});
    }
  } else if (planned.size() == 1) {
    planned[0]->done(status, StepTiming{NanosBetween(planned[0]->arrival, start), compute_ns,
                                        static_cast<int>(steps)});
  } else {
    // The engine is all-or-nothing, so nothing changed: run each call alone and let only the
    // calls that cannot run (e.g. whose pages do not fit) fail.
    stats.retried_alone = true;
    retried_alone_.fetch_add(1, std::memory_order_relaxed);
    for (size_t i = 0; i < planned.size(); ++i) {
      const SchedulerClock::time_point retry = SchedulerClock::now();
      StepPlan* one[] = {&plans[i]};
      int64_t one_ns = 0;
      absl::Status s = RunDecodeOrOutOfMemory(*session_, one, &one_ns, &outputs);
      stats.compute_ns += one_ns;
      const StepTiming timing{NanosBetween(planned[i]->arrival, retry), one_ns,
                              static_cast<int>(plans[i].inputs.size())};
      if (s.ok()) {
        NoteAnswered(absl::MakeConstSpan(&outputs[0], 1), one_ns);
        planned[i]->done(std::move(outputs[0]), timing);
      } else {
        planned[i]->done(s, timing);
      }
    }
  }
  decode_batches_.fetch_add(1, std::memory_order_relaxed);
  decode_steps_.fetch_add(steps, std::memory_order_relaxed);
  RaiseMax(max_decode_batch_, steps);
  if (context_.observer) context_.observer(*session_, stats);
}

void SessionScheduler::NoteAnswered(absl::Span<const std::vector<StepOutput>> answers,
                                     int64_t compute_ns) {
  absl::MutexLock lock(&mu_);
  // A request whose next step is already here (a client with steps in flight) is not coming back.
  absl::flat_hash_set<absl::string_view> waiting;
  for (const Pending& p : pending_) {
    if (p.call == nullptr) continue;
    for (const StepInput& in : p.call->inputs) waiting.insert(in.request_id);
  }
  for (const std::vector<StepOutput>& answer : answers) {
    for (const StepOutput& out : answer) {
      if (!waiting.contains(out.request_id)) returning_.insert(out.request_id);
    }
  }
  answered_at_ = SchedulerClock::now();
  // The longest since the last launch: a small batch an op flushed in between (see FlushBefore)
  // does not shorten the wait for the streams of the full one.
  answered_batch_ns_ = std::max(answered_batch_ns_, compute_ns);
}

// A Forward between its turns. Answers its call exactly once: if it is dropped unanswered (the
// executor refused its next turn while shutting down), with UNAVAILABLE.
struct SessionScheduler::ForwardRun {
  std::unique_ptr<ForwardCall> call;
  bool started = false;                 // Its first turn came.
  std::unique_ptr<PrefillRun> prefill;  // Once planned: the chunks, run one per turn.
  StepTiming timing;
  BatchStats stats;
  bool answered = false;

  void Answer(absl::StatusOr<std::vector<StepOutput>> result) {
    answered = true;
    call->done(std::move(result), timing);
  }
  ~ForwardRun() {
    if (answered) return;
    if (!started) {
      timing = StepTiming{};
      timing.reached_turn = false;
    }
    Answer(ShuttingDownError());
  }
};

void SessionScheduler::SubmitForward(std::unique_ptr<ForwardCall> call) {
  auto forward = std::make_shared<ForwardRun>();
  forward->call = std::move(call);
  std::vector<std::string> request_ids = forward->call->request_ids;
  // Refused (shutting down): `forward` is dropped unanswered here, which answers UNAVAILABLE.
  PostOpTurns(std::move(request_ids),
              std::make_shared<OpTurn>([this, forward] { return ForwardTurn(*forward); }));
}

SessionScheduler::TurnResult SessionScheduler::ForwardTurn(ForwardRun& forward) {
  try {
    return ComputeForwardTurn(forward) ? TurnResult::kOver : TurnResult::kAgain;
  } catch (const std::bad_alloc&) {
    // The call's memory could not be allocated: it fails alone (a chunk that could not allocate
    // undid its run; memory for planning or recording is taken before anything changes), and
    // the process and the other calls go on. A run that had started is undone.
    if (forward.prefill != nullptr) session_->AbortPrefill(*forward.prefill);
    if (!forward.answered) forward.Answer(OutOfMemoryError("this Forward"));
    return TurnResult::kOver;
  }
}

bool SessionScheduler::ComputeForwardTurn(ForwardRun& forward) {
  ForwardCall& call = *forward.call;
  if (!forward.started) {
    forward.started = true;
    // A call cancelled while queued is dropped before it changes any request.
    if (call.is_cancelled && call.is_cancelled()) {
      forward.timing.reached_turn = false;
      forward.Answer(absl::CancelledError("call cancelled"));
      return true;
    }
    forward.timing.queue_ns = NanosBetween(call.arrival, SchedulerClock::now());
    absl::StatusOr<std::vector<StepInput>> inputs = call.read_inputs();
    if (!inputs.ok()) {
      forward.Answer(inputs.status());
      return true;
    }
    BatchStats& stats = forward.stats;
    stats.decode = false;
    stats.size = stats.calls = static_cast<int64_t>(inputs->size());
    for (const StepInput& in : *inputs) stats.tokens += in.hidden.dim(0);
    forward.timing.batch_size = static_cast<int>(stats.size);
    absl::StatusOr<StepPlan> plan =
        session_->Plan(*std::move(inputs), /*decode=*/false, call.call_id, call.layer);
    if (!plan.ok()) {
      forward.Answer(plan.status());
      return true;
    }
    if (plan->replay) {  // Already applied.
      forward.Answer(std::move(plan->replayed));
      return true;
    }
    absl::StatusOr<std::unique_ptr<PrefillRun>> prefill =
        session_->StartPrefill(*std::move(plan), context_.options.prefill_chunk_tokens);
    if (!prefill.ok()) {
      forward.Answer(prefill.status());
      return true;
    }
    forward.prefill = *std::move(prefill);
  }
  // One chunk per turn: long prompts give the executor up between chunks (see the header).
  PrefillRun& prefill = *forward.prefill;
  absl::Status status = session_->RunPrefillChunk(prefill);
  forward.timing.compute_ns = prefill.compute_ns();
  if (!status.ok()) {
    forward.Answer(status);
    return true;
  }
  CountPrefillChunk();
  if (!prefill.all_chunks_ran()) return false;
  std::vector<StepOutput> outputs = session_->FinishPrefill(prefill);
  forward.stats.chunks = prefill.chunks_run();
  forward.stats.compute_ns = prefill.compute_ns();
  if (context_.observer) context_.observer(*session_, forward.stats);
  forward.Answer(std::move(outputs));
  return true;
}

void SessionScheduler::CountPrefillChunk() {
  prefill_chunks_.fetch_add(1, std::memory_order_relaxed);
}

void SessionScheduler::ObserveForward(const BatchStats& stats) {
  if (context_.observer) context_.observer(*session_, stats);
}

SchedulerCounters SessionScheduler::counters() const {
  SchedulerCounters c;
  c.decode_batches = decode_batches_.load(std::memory_order_relaxed);
  c.decode_steps = decode_steps_.load(std::memory_order_relaxed);
  c.max_decode_batch = max_decode_batch_.load(std::memory_order_relaxed);
  c.prefill_chunks = prefill_chunks_.load(std::memory_order_relaxed);
  c.batches_retried_alone = retried_alone_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  for (const Pending& p : pending_) {
    if (p.call != nullptr) c.decode_steps_waiting += static_cast<int64_t>(p.call->inputs.size());
  }
  return c;
}

}  // namespace attnserve::server

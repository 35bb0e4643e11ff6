#include "client/attnbench/runner.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/common/forward_call.h"
#include "client/common/status_names.h"
#include "client/common/session_routing.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "kernels/spec/layer_spec.h"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr int kInputsPerStream = 8;   // Distinct decode inputs per stream, cycled.
constexpr int kMaxErrorMessages = 8;  // Error messages kept per cell.
constexpr double kPoolShare = 0.9;    // Of the free KV pool, what the cell's streams may fill.

// Timing.batch_size (the steps in the engine call that served a step) when the server's proto has
// it; read by reflection so attnbench builds against either version of the API.
const google::protobuf::FieldDescriptor* TimingBatchSizeField() {
  static const google::protobuf::FieldDescriptor* const field = [] {
    const google::protobuf::FieldDescriptor* f =
        v1::Timing::descriptor()->FindFieldByName("batch_size");
    if (f == nullptr || f->is_repeated()) return static_cast<decltype(f)>(nullptr);
    const auto type = f->cpp_type();
    return type == google::protobuf::FieldDescriptor::CPPTYPE_INT32 ||
                   type == google::protobuf::FieldDescriptor::CPPTYPE_INT64
               ? f
               : nullptr;
  }();
  return field;
}

int64_t TimingBatchSize(const v1::Timing& timing) {
  const google::protobuf::FieldDescriptor* field = TimingBatchSizeField();
  if (field == nullptr) return 0;
  return field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT32
             ? timing.GetReflection()->GetInt32(timing, field)
             : timing.GetReflection()->GetInt64(timing, field);
}

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
      .count();
}

// One stream and the requests it decodes in turn. Written by its worker thread; the atomics and
// the context pointer are also read by the watchdog (the main thread); the rest is read after the
// worker is joined.
struct Stream {
  int index = 0;
  std::string request_id;  // The request being decoded.
  int requests = 0;        // Requests prefilled so far.
  std::vector<v1::DecodeRequest> inputs;
  v1::Tensor prefill_hidden;  // [prefill_tokens, d_model], reused by every re-prefill.

  std::vector<double> latencies_ms;
  std::vector<double> prefill_ms;  // Re-prefills in the timed window (Forward latency).
  int64_t reprefill_ns = 0;        // Release + Forward of the re-prefills.
  int64_t context_sum = 0, context_max = 0;
  int64_t queue_ns = 0, compute_ns = 0, total_ns = 0;
  int64_t batch_size_sum = 0;  // Timing.batch_size summed over steps (0 when absent).
  bool failed = false;
  grpc::Status error;
  std::string error_where;
  int64_t last_answer_ns = 0;

  std::atomic<int64_t> steps_done{0};
  std::atomic<int64_t> outstanding_since_ns{0};  // 0 = no call outstanding on the stream.
  std::atomic<bool> finished{false};

  absl::Mutex mu;
  grpc::ClientContext* context ABSL_GUARDED_BY(mu) = nullptr;
  bool cancelled_by_watchdog ABSL_GUARDED_BY(mu) = false;

  void Fail(std::string where, grpc::Status status) {
    if (failed) return;
    failed = true;
    error_where = std::move(where);
    error = std::move(status);
  }
};

// The start line all workers wait at once prefilled.
struct StartGate {
  absl::Mutex mu;
  int ready ABSL_GUARDED_BY(mu) = 0;
  bool open ABSL_GUARDED_BY(mu) = false;
  bool abort ABSL_GUARDED_BY(mu) = false;
  int64_t start_ns ABSL_GUARDED_BY(mu) = 0;
};

struct CellPlan {
  std::string session;
  int concurrency = 1;
  int d_model = 0;
  int64_t prefill_tokens = 0;     // Each request's prompt.
  int64_t steps_per_request = 0;  // Decode steps before a request is replaced.
  int64_t steps = 0;              // > 0: steps per stream.
  absl::Duration duration;        // When steps == 0.
  absl::Duration step_timeout;
  absl::Duration call_timeout;  // Forward, Release, and the wait at the start line.
};

// Prefills a fresh request of `tokens` tokens (the first `tokens` rows of `hidden`, or `hidden`
// whole) and points the stream's decode inputs at it.
bool Prefill(const Client& client, const CellPlan& plan, const v1::Tensor& hidden,
             int64_t tokens, Stream* stream) {
  stream->request_id = absl::StrCat("bench-", stream->index, "-", stream->requests++);
  v1::ForwardRequest forward;
  forward.set_session_id(plan.session);
  v1::ForwardItem* item = forward.add_items();
  item->set_request_id(stream->request_id);
  *item->mutable_hidden() = hidden;
  for (v1::DecodeRequest& input : stream->inputs) {
    input.mutable_items(0)->set_request_id(stream->request_id);
  }
  v1::ForwardResponse forwarded;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + plan.call_timeout));
  grpc::Status status = CallForward(client, &context, forward, &forwarded);
  if (!status.ok()) {
    stream->Fail("prefill (Forward)", status);
    return false;
  }
  if (forwarded.results_size() != 1 || forwarded.results(0).sequence_length() != tokens) {
    stream->Fail("prefill (Forward)",
                 grpc::Status(grpc::StatusCode::INTERNAL,
                              absl::StrCat("client check: the answer is not one result of ",
                                           tokens, " tokens")));
    return false;
  }
  return true;
}

bool ReleaseRequest(const Client& client, const CellPlan& plan, Stream* stream) {
  v1::ReleaseRequest release;
  release.set_session_id(plan.session);
  release.set_request_id(stream->request_id);
  v1::ReleaseResponse released;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + plan.call_timeout));
  grpc::Status status = client.stub->Release(&context, release, &released);
  if (!status.ok()) stream->Fail("release", status);
  return status.ok();
}

void RunStream(const Client& client, const CellPlan& plan, uint64_t seed, StartGate* gate,
               Stream* stream) {
  // 1. The first request, staggered: stream i starts i / C of the way into its steps.
  const int64_t offset = plan.steps_per_request * stream->index / plan.concurrency;
  int64_t length = plan.prefill_tokens + offset;          // The current request's length.
  int64_t steps_left = plan.steps_per_request - offset;  // Before it is replaced.
  {
    std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(stream->index));
    TensorToProto(RandomHidden(rng, plan.prefill_tokens, plan.d_model, DType::kF32),
                  &stream->prefill_hidden);
    for (int i = 0; i < kInputsPerStream; ++i) {
      v1::DecodeRequest step;
      step.set_session_id(plan.session);
      v1::DecodeItem* decode_item = step.add_items();
      TensorToProto(RandomHidden(rng, 1, plan.d_model, DType::kF32), decode_item->mutable_hidden());
      stream->inputs.push_back(std::move(step));
    }
    v1::Tensor first = stream->prefill_hidden;
    if (offset > 0) {
      TensorToProto(RandomHidden(rng, length, plan.d_model, DType::kF32), &first);
    }
    Prefill(client, plan, first, length, stream);
  }
  // 2. The start line (bounded: the main thread opens or aborts it).
  int64_t start_ns = 0;
  {
    absl::MutexLock lock(&gate->mu);
    ++gate->ready;
    auto released = [gate]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate->mu) {
      return gate->open || gate->abort;
    };
    if (!gate->mu.AwaitWithTimeout(absl::Condition(&released), plan.call_timeout * 2) ||
        gate->abort) {
      stream->Fail("start", grpc::Status(grpc::StatusCode::ABORTED,
                                         "the other streams did not finish their prefill in time"));
    }
    start_ns = gate->start_ns;
  }
  if (stream->failed) {
    stream->finished = true;
    return;
  }
  // 3. Decode over one DecodeStream, one step outstanding at a time; every steps_per_request
  // steps the request is released and a fresh one prefilled.
  grpc::ClientContext context;
  const int64_t max_reprefills =
      plan.steps > 0 ? plan.steps / std::max<int64_t>(1, plan.steps_per_request) + 1 : 0;
  const absl::Duration budget =
      plan.steps > 0 ? plan.step_timeout * static_cast<double>(plan.steps) +
                           plan.call_timeout * 2 * static_cast<double>(max_reprefills)
                     : plan.duration + plan.step_timeout + plan.call_timeout * 2;
  context.set_deadline(absl::ToChronoTime(absl::Now() + budget + absl::Seconds(10)));
  AddSessionMetadata(&context, plan.session);  // A stream's metadata leaves before its messages.
  {
    absl::MutexLock lock(&stream->mu);
    stream->context = &context;
  }
  const int64_t stop_ns = start_ns + absl::ToInt64Nanoseconds(plan.duration);
  std::unique_ptr<grpc::ClientReaderWriter<v1::DecodeRequest, v1::DecodeResponse>> call =
      client.stub->DecodeStream(&context);
  bool broken = false;  // The stream can take no more writes (its status comes from Finish).
  for (int64_t step = 1;; ++step) {
    if (plan.steps > 0 ? step > plan.steps : NowNanos() >= stop_ns) break;
    if (steps_left == 0) {
      // Replace the request (no step outstanding: the watchdog leaves the stream alone; both
      // calls have their own deadline).
      const int64_t begin = NowNanos();
      if (!ReleaseRequest(client, plan, stream)) break;
      const int64_t forward_begin = NowNanos();
      if (!Prefill(client, plan, stream->prefill_hidden, plan.prefill_tokens, stream)) break;
      const int64_t end = NowNanos();
      stream->prefill_ms.push_back(static_cast<double>(end - forward_begin) / 1e6);
      stream->reprefill_ns += end - begin;
      length = plan.prefill_tokens;
      steps_left = plan.steps_per_request;
      if (plan.steps == 0 && end >= stop_ns) break;
    }
    const v1::DecodeRequest& input = stream->inputs[(step - 1) % kInputsPerStream];
    v1::DecodeResponse response;
    const int64_t begin = NowNanos();
    stream->outstanding_since_ns = begin;
    if (!call->Write(input) || !call->Read(&response)) {
      stream->error_where = absl::StrCat("step ", step);
      broken = true;
      break;
    }
    const int64_t end = NowNanos();
    stream->outstanding_since_ns = 0;
    if (response.results_size() != 1 || response.results(0).sequence_length() != length + 1 ||
        response.results(0).output().shape_size() == 0 ||
        response.results(0).output().shape(response.results(0).output().shape_size() - 1) !=
            plan.d_model) {
      stream->Fail(absl::StrCat("step ", step),
                   grpc::Status(grpc::StatusCode::INTERNAL,
                                absl::StrCat("client check: expected one result of length ",
                                             length + 1, " and width ", plan.d_model)));
      break;
    }
    ++length;
    --steps_left;
    stream->context_sum += length;
    stream->context_max = std::max(stream->context_max, length);
    stream->latencies_ms.push_back(static_cast<double>(end - begin) / 1e6);
    stream->queue_ns += response.timing().queue_ns();
    stream->compute_ns += response.timing().compute_ns();
    stream->total_ns += response.timing().total_ns();
    stream->batch_size_sum += TimingBatchSize(response.timing());
    stream->last_answer_ns = end;
    stream->steps_done.store(step, std::memory_order_relaxed);
  }
  if (stream->failed) {
    context.TryCancel();  // A malformed answer: do not wait for the rest of the stream.
  } else if (!broken) {
    stream->outstanding_since_ns = NowNanos();
    call->WritesDone();
  }
  stream->outstanding_since_ns = NowNanos();
  grpc::Status status = call->Finish();
  stream->outstanding_since_ns = 0;
  bool by_watchdog = false;
  {
    absl::MutexLock lock(&stream->mu);
    stream->context = nullptr;
    by_watchdog = stream->cancelled_by_watchdog;
  }
  if (by_watchdog) {
    stream->Fail(stream->error_where.empty() ? "end" : stream->error_where,
                 grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              absl::StrCat("client watchdog: no answer within ",
                                           absl::FormatDuration(plan.step_timeout),
                                           " (--step_timeout); stream cancelled")));
  } else if (!status.ok()) {
    stream->Fail(stream->error_where.empty() ? "end" : stream->error_where, status);
  } else if (broken) {
    stream->Fail(stream->error_where,
                 grpc::Status(grpc::StatusCode::UNKNOWN,
                              "the server ended the stream with OK before answering this step"));
  }
  stream->finished = true;
}

}  // namespace

int64_t DefaultStepsPerRequest(int context) { return std::max(1, context / 4); }

int64_t PrefillTokens(int context, int64_t steps_per_request) {
  return std::max<int64_t>(1, context - steps_per_request / 2);
}

namespace {


void AddError(BenchResult* result, const std::string& where, const grpc::Status& status) {
  ++result->errors;
  ++result->errors_by_code[GrpcCodeName(status.error_code())];
  if (static_cast<int>(result->error_messages.size()) < kMaxErrorMessages) {
    result->error_messages.push_back(absl::StrCat(where, ": ", GrpcStatusString(status)));
  }
}

void ReleaseSession(const Client& client, const std::string& session, BenchResult* result) {
  grpc::Status status = CallRelease(client, session);
  if (!status.ok()) AddError(result, "Release", status);
}

}  // namespace

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

grpc::Status ConfigureSession(const Client& client, const BenchCell& cell, DType kv_dtype,
                              uint64_t seed, int max_requests, v1::ConfigureResponse* configured,
                              LayerSpec* spec) {
  v1::ConfigureRequest configure;
  if (!cell.spec_from_checkpoint) *configure.mutable_spec() = LayerSpecToProto(cell.variant.spec);
  if (!cell.checkpoint.empty()) {
    configure.mutable_weights()->mutable_checkpoint()->set_path(cell.checkpoint);
    configure.mutable_weights()->mutable_checkpoint()->set_layer_index(cell.layer);
  } else {
    configure.mutable_weights()->set_seed(seed);
  }
  configure.set_kv_cache_dtype(DTypeToProto(kv_dtype));
  configure.set_max_requests(max_requests);
  configure.set_label(absl::StrCat("attnbench ", cell.variant.label, " c=", cell.concurrency,
                                   " ctx=", cell.context));
  grpc::ClientContext context;
  client.Prepare(&context);
  grpc::Status status = client.stub->Configure(&context, configure, configured);
  if (!status.ok()) return status;
  *spec = cell.variant.spec;
  if (cell.spec_from_checkpoint) {
    // The layer the server read from the checkpoint.
    absl::StatusOr<LayerSpec> resolved = LayerSpecFromProto(configured->spec());
    if (!resolved.ok()) {
      return grpc::Status(
          grpc::StatusCode::INTERNAL,
          absl::StrCat("client check: the server's spec: ", resolved.status().message()));
    }
    *spec = *resolved;
  }
  return grpc::Status::OK;
}

BenchResult RunCell(const Client& client, const ServerBatchStats& batch_stats,
                    const BenchOptions& options, const BenchCell& cell) {
  BenchResult result;
  LayerSpec spec = cell.variant.spec;
  result.variant = std::string(VariantName(spec.variant));
  result.label = cell.variant.label;
  result.spec = LayerSpecSummary(spec);
  result.context = cell.context;
  result.concurrency = cell.concurrency;

  v1::GetServerInfoResponse info;
  {
    grpc::ClientContext context;
    client.Prepare(&context);
    grpc::Status status = client.stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    if (!status.ok()) {
      AddError(&result, "GetServerInfo", status);
      return result;
    }
  }
  v1::ConfigureResponse configured;
  if (grpc::Status status = ConfigureSession(client, cell, options.kv_dtype, options.seed,
                                             cell.concurrency, &configured, &spec);
      !status.ok()) {
    AddError(&result, "Configure", status);
    if (!configured.session_id().empty()) {
      ReleaseSession(client, configured.session_id(), &result);
    }
    return result;
  }
  result.variant = std::string(VariantName(spec.variant));
  result.spec = LayerSpecSummary(spec);
  result.kv_bytes_per_token = configured.cost().kv_bytes_per_token();

  CellPlan plan;
  plan.session = configured.session_id();
  plan.concurrency = cell.concurrency;
  plan.d_model = spec.d_model;
  plan.steps_per_request = options.steps_per_request > 0 ? options.steps_per_request
                                                         : DefaultStepsPerRequest(cell.context);
  plan.prefill_tokens = PrefillTokens(cell.context, plan.steps_per_request);
  plan.steps = options.steps;
  plan.duration = options.duration;
  plan.step_timeout = options.step_timeout;
  plan.call_timeout = client.timeout;
  result.steps_per_request = plan.steps_per_request;
  result.prefill_tokens = plan.prefill_tokens;
  // Every request must fit below the request limit and its share of the free pool.
  const int64_t free_bytes = info.kv_pool_capacity_bytes() - info.kv_pool_used_bytes();
  const int64_t page_bytes = std::max<int64_t>(1, configured.cost().page_bytes());
  const int64_t per_stream_bytes =
      static_cast<int64_t>(kPoolShare * static_cast<double>(free_bytes)) / cell.concurrency -
      page_bytes;
  int64_t tokens_cap =
      info.limits().max_sequence_length() > 0 ? info.limits().max_sequence_length() : INT64_MAX;
  if (result.kv_bytes_per_token > 0) {
    tokens_cap = std::min(tokens_cap, per_stream_bytes / result.kv_bytes_per_token);
  }
  result.tokens_cap = tokens_cap;
  if (plan.prefill_tokens + plan.steps_per_request > tokens_cap) {
    AddError(&result, "plan",
             grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("client check: ", cell.concurrency, " requests of up to ",
                                       plan.prefill_tokens + plan.steps_per_request,
                                       " tokens do not fit (cap ", tokens_cap,
                                       " tokens per request)")));
    ReleaseSession(client, plan.session, &result);
    return result;
  }

  const std::string variant_label =
      spec.sliding_window > 0 ? absl::StrCat(result.variant, "_swa") : result.variant;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < cell.concurrency; ++i) {
    auto stream = std::make_unique<Stream>();
    stream->index = i;
    stream->request_id = absl::StrCat("bench-", i);
    streams.push_back(std::move(stream));
  }
  StartGate gate;
  std::vector<std::thread> workers;
  for (auto& stream : streams) {
    workers.emplace_back(RunStream, std::cref(client), std::cref(plan), options.seed, &gate,
                         stream.get());
  }

  // The main thread: opens the start line once every stream is prefilled, cancels streams whose
  // step is outstanding past --step_timeout, draws the progress line.
  const bool tty = options.progress && isatty(STDERR_FILENO);
  const absl::Time prefill_deadline = absl::Now() + client.timeout + absl::Seconds(5);
  bool started = false;
  BatchSnapshot before;
  int64_t start_ns = 0;
  const int64_t step_timeout_ns = absl::ToInt64Nanoseconds(options.step_timeout);
  int64_t last_draw_ns = 0;
  for (;;) {
    bool all_finished = true;
    for (auto& stream : streams) all_finished = all_finished && stream->finished.load();
    if (all_finished) break;
    if (!started) {
      bool ready = false;
      {
        absl::MutexLock lock(&gate.mu);
        ready = gate.ready == cell.concurrency;
        if (!ready && absl::Now() > prefill_deadline) gate.abort = true;
      }
      if (ready) {
        before = batch_stats.Take(plan.session, variant_label);
        absl::MutexLock lock(&gate.mu);
        start_ns = NowNanos();
        gate.start_ns = start_ns;
        gate.open = true;
        started = true;
      }
    }
    const int64_t now = NowNanos();
    for (auto& stream : streams) {
      const int64_t since = stream->outstanding_since_ns.load();
      if (since != 0 && now - since > step_timeout_ns) {
        absl::MutexLock lock(&stream->mu);
        if (stream->context != nullptr && !stream->cancelled_by_watchdog) {
          stream->cancelled_by_watchdog = true;
          stream->context->TryCancel();
        }
      }
    }
    if (tty && now - last_draw_ns > 250'000'000) {
      last_draw_ns = now;
      int64_t steps = 0;
      int failed = 0;
      for (auto& stream : streams) {
        steps += stream->steps_done.load(std::memory_order_relaxed);
        failed += stream->finished.load() && stream->failed ? 1 : 0;
      }
      const double elapsed = started ? static_cast<double>(now - start_ns) / 1e9 : 0;
      std::string goal =
          options.steps > 0
              ? absl::StrFormat("%d/%d steps", steps, options.steps * cell.concurrency)
              : absl::StrFormat("%d steps, %.1f/%.1f s", steps, elapsed,
                                absl::ToDoubleSeconds(options.duration));
      std::fprintf(stderr, "\r\033[K[attnbench] %s c=%d ctx=%d: %s, %.0f tok/s, errors %d",
                   cell.variant.label.c_str(), cell.concurrency, cell.context,
                   started ? goal.c_str() : "prefilling",
                   elapsed > 0 ? static_cast<double>(steps) / elapsed : 0.0, failed);
      std::fflush(stderr);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (std::thread& worker : workers) worker.join();
  if (tty) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

  std::vector<double> latencies, prefills;
  int64_t last_answer_ns = start_ns;
  int64_t queue_ns = 0, compute_ns = 0, total_ns = 0, batch_size_sum = 0;
  int64_t context_sum = 0, reprefill_ns = 0;
  for (auto& stream : streams) {
    batch_size_sum += stream->batch_size_sum;
    latencies.insert(latencies.end(), stream->latencies_ms.begin(), stream->latencies_ms.end());
    prefills.insert(prefills.end(), stream->prefill_ms.begin(), stream->prefill_ms.end());
    last_answer_ns = std::max(last_answer_ns, stream->last_answer_ns);
    queue_ns += stream->queue_ns;
    compute_ns += stream->compute_ns;
    total_ns += stream->total_ns;
    context_sum += stream->context_sum;
    result.max_context = std::max(result.max_context, stream->context_max);
    reprefill_ns += stream->reprefill_ns;
    if (stream->failed) {
      AddError(&result, absl::StrCat("stream ", stream->index, " ", stream->error_where),
               stream->error);
    }
  }
  result.steps = static_cast<int64_t>(latencies.size());
  result.seconds = static_cast<double>(last_answer_ns - start_ns) / 1e9;
  result.reprefills = static_cast<int64_t>(prefills.size());
  result.reprefill_seconds = static_cast<double>(reprefill_ns) / 1e9 / cell.concurrency;
  if (result.seconds > 0) {
    result.wall_tokens_per_s = static_cast<double>(result.steps) / result.seconds;
    const double decode_seconds = result.seconds - result.reprefill_seconds;
    result.tokens_per_s = decode_seconds > 0 ? static_cast<double>(result.steps) / decode_seconds
                                             : result.wall_tokens_per_s;
  }
  if (result.steps > 0) {
    result.mean_context = static_cast<double>(context_sum) / static_cast<double>(result.steps);
  }
  if (!prefills.empty()) {
    std::sort(prefills.begin(), prefills.end());
    double sum = 0;
    for (double p : prefills) sum += p;
    result.prefill_mean_ms = sum / static_cast<double>(prefills.size());
    result.prefill_p50_ms = Percentile(prefills, 0.50);
    result.prefill_p99_ms = Percentile(prefills, 0.99);
  }
  if (!latencies.empty()) {
    std::sort(latencies.begin(), latencies.end());
    double sum = 0;
    for (double latency : latencies) sum += latency;
    const double n = static_cast<double>(latencies.size());
    result.latency_mean_ms = sum / n;
    result.latency_p50_ms = Percentile(latencies, 0.50);
    result.latency_p90_ms = Percentile(latencies, 0.90);
    result.latency_p99_ms = Percentile(latencies, 0.99);
    result.latency_max_ms = latencies.back();
    result.queue_ms = static_cast<double>(queue_ns) / 1e6 / n;
    result.compute_ms = static_cast<double>(compute_ns) / 1e6 / n;
    result.server_total_ms = static_cast<double>(total_ns) / 1e6 / n;
    if (batch_size_sum > 0) result.step_batch_size = static_cast<double>(batch_size_sum) / n;
  }
  if (started) {
    result.batch = ServerBatchStats::Between(before, batch_stats.Take(plan.session, variant_label));
  } else {
    result.batch.note = "the run did not start";
  }
  ReleaseSession(client, plan.session, &result);
  return result;
}

}  // namespace attnserve

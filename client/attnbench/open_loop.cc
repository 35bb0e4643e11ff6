#include "client/attnbench/open_loop.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <list>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/common/session_routing.h"
#include "client/common/forward_call.h"
#include "client/common/status_names.h"
#include "kernels/spec/layer_spec.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr int kInputs = 8;            // Distinct decode inputs, cycled.
constexpr int kMaxErrorMessages = 8;  // Error messages kept per run.

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
      .count();
}

struct Plan {
  std::string session;
  int d_model = 0;
  int prompt_tokens = 0;
  int64_t decode_steps = 0;
  absl::Duration step_timeout;
  absl::Duration call_timeout;
  v1::Tensor prompt;                // [prompt_tokens, d_model], every request's prompt.
  std::vector<v1::Tensor> inputs;   // kInputs of [1, d_model].
};

// One request, written by its thread; `done` tells the dispatcher it may be joined.
struct Request {
  int64_t index = 0;
  int64_t scheduled_ns = 0;
  bool delayed = false;
  double ttft_ms = -1;
  double e2e_ms = -1;
  std::vector<double> itl_ms;
  int64_t context_sum = 0;
  bool failed = false;
  grpc::Status error;
  std::string error_where;
  int64_t last_answer_ns = 0;
  std::atomic<bool> done{false};
  std::thread thread;

  void Fail(std::string where, grpc::Status status) {
    if (failed) return;
    failed = true;
    error_where = std::move(where);
    error = std::move(status);
  }
};

void RunRequest(const Client& client, const Plan& plan, Request* request) {
  const std::string id = absl::StrCat("open-", request->index);
  // 1. Prefill: the first token.
  {
    v1::ForwardRequest forward;
    forward.set_session_id(plan.session);
    v1::ForwardItem* item = forward.add_items();
    item->set_request_id(id);
    *item->mutable_hidden() = plan.prompt;
    v1::ForwardResponse forwarded;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + plan.call_timeout));
    grpc::Status status = CallForward(client, &context, forward, &forwarded);
    if (!status.ok()) {
      request->Fail("prefill (Forward)", status);
    } else if (forwarded.results_size() != 1 ||
               forwarded.results(0).sequence_length() != plan.prompt_tokens) {
      request->Fail("prefill (Forward)",
                    grpc::Status(grpc::StatusCode::INTERNAL,
                                 "client check: the answer is not one result of the prompt"));
    }
    const int64_t now = NowNanos();
    request->ttft_ms = static_cast<double>(now - request->scheduled_ns) / 1e6;
    request->last_answer_ns = now;
  }
  // 2. Decode steps over the request's own stream (bounded by its deadline).
  if (!request->failed && plan.decode_steps > 0) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(
        absl::Now() + plan.step_timeout * static_cast<double>(plan.decode_steps) +
        absl::Seconds(10)));
    AddSessionMetadata(&context, plan.session);
    auto call = client.stub->DecodeStream(&context);
    bool broken = false;
    v1::DecodeRequest input;
    input.set_session_id(plan.session);
    input.add_items()->set_request_id(id);
    for (int64_t step = 1; step <= plan.decode_steps; ++step) {
      *input.mutable_items(0)->mutable_hidden() = plan.inputs[(step - 1) % plan.inputs.size()];
      v1::DecodeResponse response;
      const int64_t begin = NowNanos();
      if (!call->Write(input) || !call->Read(&response)) {
        request->error_where = absl::StrCat("step ", step);
        broken = true;
        break;
      }
      const int64_t end = NowNanos();
      if (response.results_size() != 1 ||
          response.results(0).sequence_length() != plan.prompt_tokens + step) {
        request->Fail(absl::StrCat("step ", step),
                      grpc::Status(grpc::StatusCode::INTERNAL,
                                   absl::StrCat("client check: expected one result of length ",
                                                plan.prompt_tokens + step)));
        break;
      }
      request->itl_ms.push_back(static_cast<double>(end - begin) / 1e6);
      request->context_sum += plan.prompt_tokens + step;
      request->last_answer_ns = end;
    }
    if (request->failed) {
      context.TryCancel();
    } else if (!broken) {
      call->WritesDone();
    }
    grpc::Status status = call->Finish();
    if (!status.ok()) {
      request->Fail(request->error_where.empty() ? "end" : request->error_where, status);
    } else if (broken) {
      request->Fail(request->error_where,
                    grpc::Status(grpc::StatusCode::UNKNOWN,
                                 "the server ended the stream with OK before answering"));
    }
  }
  if (!request->failed) {
    request->e2e_ms = static_cast<double>(request->last_answer_ns - request->scheduled_ns) / 1e6;
  }
  // 3. Release (also after a failure, so the pool does not fill with dead requests).
  {
    v1::ReleaseRequest release;
    release.set_session_id(plan.session);
    release.set_request_id(id);
    v1::ReleaseResponse released;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + plan.call_timeout));
    grpc::Status status = client.stub->Release(&context, release, &released);
    if (!status.ok() && !request->failed) request->Fail("release", status);
  }
  request->done = true;
}

LatencySummary Summarize(std::vector<double> values) {
  LatencySummary summary;
  if (values.empty()) return summary;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  summary.mean = sum / static_cast<double>(values.size());
  summary.p50 = Percentile(values, 0.50);
  summary.p90 = Percentile(values, 0.90);
  summary.p99 = Percentile(values, 0.99);
  summary.max = values.back();
  return summary;
}

void AddError(OpenLoopResult* result, const std::string& where, const grpc::Status& status) {
  ++result->errors;
  ++result->errors_by_code[GrpcCodeName(status.error_code())];
  if (static_cast<int>(result->error_messages.size()) < kMaxErrorMessages) {
    result->error_messages.push_back(absl::StrCat(where, ": ", GrpcStatusString(status)));
  }
}

}  // namespace

OpenLoopResult RunOpenLoop(const Client& client, const OpenLoopOptions& options,
                           const BenchCell& cell) {
  OpenLoopResult result;
  result.label = cell.variant.label;
  result.rate = options.rate;
  result.prompt_tokens = options.prompt_tokens;
  result.decode_steps = options.decode_steps;
  result.max_in_flight = options.max_in_flight;

  v1::ConfigureResponse configured;
  LayerSpec spec;
  // max_requests 0: the server's limit (a request that does not fit is that server's answer).
  if (grpc::Status status =
          ConfigureSession(client, cell, options.kv_dtype, options.seed, 0, &configured, &spec);
      !status.ok()) {
    AddError(&result, "Configure", status);
    return result;
  }
  result.variant = std::string(VariantName(spec.variant));
  result.spec = LayerSpecSummary(spec);

  Plan plan;
  plan.session = configured.session_id();
  plan.d_model = spec.d_model;
  plan.prompt_tokens = options.prompt_tokens;
  plan.decode_steps = options.decode_steps;
  plan.step_timeout = options.step_timeout;
  plan.call_timeout = client.timeout;
  std::mt19937_64 rng(options.seed * 7919u + 17u);
  TensorToProto(RandomHidden(rng, plan.prompt_tokens, plan.d_model, DType::kF32), &plan.prompt);
  for (int i = 0; i < kInputs; ++i) {
    plan.inputs.emplace_back();
    TensorToProto(RandomHidden(rng, 1, plan.d_model, DType::kF32), &plan.inputs.back());
  }

  // The dispatcher: starts each request at its arrival time, joins finished ones as it goes.
  std::exponential_distribution<double> gap(options.rate);
  std::vector<double> ttft, itl, e2e;
  int64_t context_sum = 0, last_answer_ns = 0;
  auto collect = [&](Request& r) {
    r.thread.join();
    result.requests_delayed += r.delayed ? 1 : 0;
    if (r.failed) {
      AddError(&result, absl::StrCat("request ", r.index, " ", r.error_where), r.error);
    } else {
      ++result.requests_completed;
      ttft.push_back(r.ttft_ms);
      e2e.push_back(r.e2e_ms);
    }
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    context_sum += r.context_sum;
    last_answer_ns = std::max(last_answer_ns, r.last_answer_ns);
  };
  std::list<std::unique_ptr<Request>> running;
  auto reap = [&] {
    for (auto it = running.begin(); it != running.end();) {
      if ((*it)->done.load()) {
        collect(**it);
        it = running.erase(it);
      } else {
        ++it;
      }
    }
  };
  const int64_t start_ns = NowNanos();
  const int64_t window_ns = absl::ToInt64Nanoseconds(options.duration);
  double next_s = 0;
  int64_t last_arrival_ns = start_ns;
  for (int64_t index = 0;; ++index) {
    if (index > 0) next_s += gap(rng);  // The first request arrives at once.
    const int64_t scheduled = start_ns + static_cast<int64_t>(next_s * 1e9);
    if (options.num_requests > 0 ? index >= options.num_requests
                                 : scheduled - start_ns > window_ns) {
      break;
    }
    while (NowNanos() < scheduled) {
      reap();
      const int64_t wait = scheduled - NowNanos();
      if (wait > 0) absl::SleepFor(absl::Nanoseconds(std::min<int64_t>(wait, 2'000'000)));
    }
    bool delayed = false;
    while (static_cast<int>(running.size()) >= options.max_in_flight) {
      delayed = true;
      absl::SleepFor(absl::Microseconds(200));
      reap();
    }
    auto request = std::make_unique<Request>();
    request->index = index;
    request->scheduled_ns = scheduled;
    request->delayed = delayed;
    Request* raw = request.get();
    running.push_back(std::move(request));
    raw->thread = std::thread(RunRequest, std::cref(client), std::cref(plan), raw);
    ++result.requests_sent;
    result.peak_in_flight = std::max(result.peak_in_flight, static_cast<int>(running.size()));
    last_arrival_ns = scheduled;
  }
  for (auto& request : running) collect(*request);
  running.clear();

  result.arrival_seconds = static_cast<double>(last_arrival_ns - start_ns) / 1e9;
  result.seconds = static_cast<double>(std::max(last_answer_ns, start_ns) - start_ns) / 1e9;
  if (result.arrival_seconds > 0) {
    result.achieved_rate = static_cast<double>(result.requests_sent - 1) / result.arrival_seconds;
  }
  result.tokens = static_cast<int64_t>(itl.size());
  if (result.seconds > 0) {
    result.request_throughput = static_cast<double>(result.requests_completed) / result.seconds;
    result.tokens_per_s = static_cast<double>(result.tokens) / result.seconds;
  }
  if (result.tokens > 0) {
    result.mean_context = static_cast<double>(context_sum) / static_cast<double>(result.tokens);
  }
  result.ttft_ms = Summarize(std::move(ttft));
  result.itl_ms = Summarize(std::move(itl));
  result.e2e_ms = Summarize(std::move(e2e));

  v1::ReleaseRequest release;
  release.set_session_id(plan.session);
  v1::ReleaseResponse released;
  grpc::ClientContext context;
  client.Prepare(&context);
  if (grpc::Status status = client.stub->Release(&context, release, &released); !status.ok()) {
    AddError(&result, "Release", status);
  }
  return result;
}

}  // namespace attnserve

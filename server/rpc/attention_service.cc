#include "server/rpc/attention_service.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/capabilities.h"
#include "kernels/kv/quantization.h"
#include "kernels/model/kv_head_pooling.h"
#include "kernels/spec/layer_spec.h"
#include "proto/codec/capabilities_codec.h"
#include "proto/codec/kv_quantization_codec.h"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"
#include "server/fleet/drain.h"
#include "server/fleet/session_affinity.h"
#include "server/observability/call_log.h"
#include "server/observability/logging.h"
#include "server/rpc/forward_stream.h"
#include "server/rpc/reply_buffer.h"
#include "server/rpc/session_info_codec.h"
#include "server/rpc/step_codec.h"
#include "server/rpc/streamed_unary_call.h"
#include "server/rpc/wire_call.h"
#include "server/session/checkpoint_spec.h"
#include "server/session/layer_fingerprint.h"
#include "server/session/scheduler.h"
#include "server/session/session.h"
#include "server/session/stack_config.h"
#include "server/session/weight_source.h"

#ifndef ATTNSERVE_VERSION
#define ATTNSERVE_VERSION "unknown"
#endif

namespace attnserve::server {

namespace {

using Clock = std::chrono::steady_clock;

int64_t NanosSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count();
}

// Server-side timing of one call (or one stream message): arrival, compute start, compute time.
struct CallTimer {
  Clock::time_point arrival = Clock::now();
  Clock::time_point start = arrival;
  int64_t compute_ns = 0;
  bool started = false;

  void Started() {
    start = Clock::now();
    started = true;
  }
  // For metrics, as the call finishes.
  RpcTiming Timing() const {
    RpcTiming t;
    t.computed = started;
    t.queue_seconds = std::chrono::duration<double>(start - arrival).count();
    t.compute_seconds = static_cast<double>(compute_ns) * 1e-9;
    t.total_seconds = std::chrono::duration<double>(Clock::now() - arrival).count();
    return t;
  }
  void Fill(v1::Timing* timing) const {
    timing->set_queue_ns(
        std::chrono::duration_cast<std::chrono::nanoseconds>(start - arrival).count());
    timing->set_compute_ns(compute_ns);
    timing->set_total_ns(NanosSince(arrival));
  }
};

grpc::Status ShuttingDown() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
}

grpc::Status Cancelled() { return grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled"); }

// Reports a finished call (or stream message) to metrics, and its refusal for KV memory.
void Observe(Metrics& metrics, Rpc rpc, const std::string& variant, const grpc::Status& status,
             const CallTimer& timer) {
  ObserveCall(metrics, rpc, variant, status, timer.Timing());
}

// Reports a unary call to metrics (and to the log when it failed), then finishes it.
void FinishCall(UnaryCall* call, Metrics& metrics, Rpc rpc, const std::string& variant,
                const CallTimer& timer, grpc::Status status) {
  Observe(metrics, rpc, variant, status, timer);
  if (!status.ok()) {
    LogFailedCall(RpcLabel(rpc), call->peer(), static_cast<absl::StatusCode>(status.error_code()),
                  status.error_message());
  }
  call->Finish(std::move(status));
}

template <typename Result>
void FillResult(StepOutput& out, Result* result) {
  result->set_request_id(std::move(out.request_id));
  TensorToProto(out.output, result->mutable_output());
  result->set_sequence_length(out.sequence_length);
}

// Fills a Decode response from the outputs of one call's steps.
void FillDecodeResponse(std::vector<StepOutput>& outputs, const CallTimer& timer,
                        v1::DecodeResponse* response) {
  for (StepOutput& out : outputs) FillResult(out, response->add_results());
  timer.Fill(response->mutable_timing());
}

// Folds the scheduler's timing of a call into its CallTimer.
void ApplyStepTiming(const StepTiming& timing, CallTimer& timer) {
  timer.start = timer.arrival + std::chrono::nanoseconds(timing.queue_ns);
  timer.started = true;
  timer.compute_ns = timing.compute_ns;
}

// The weights of a `seed` source (as WeightsFromProto draws them), but abandoned as soon as
// `cancelled` says so: a multi-GiB layer takes seconds to draw.
absl::StatusOr<LayerWeights> SeededWeights(uint64_t seed, const LayerSpec& spec,
                                           const std::function<bool()>& cancelled) {
  absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, seed, cancelled);
  if (!weights.ok()) {
    return absl::Status(weights.status().code(),
                        absl::StrCat("weights.seed: ", weights.status().message()));
  }
  return weights;
}

}  // namespace

AttentionServiceImpl::AttentionServiceImpl(AttentionBackend* backend, Executor* executor,
                                           KvPool* pool, ParameterBudget* parameters,
                                           SessionRegistry* registry, Metrics* metrics,
                                           const ServerLimits& limits,
                                           const SchedulerOptions& scheduler,
                                           const Authenticator* authenticator)
    : backend_(backend),
      executor_(executor),
      pool_(pool),
      parameters_(parameters),
      registry_(registry),
      metrics_(metrics),
      limits_(limits),
      scheduler_options_(ResolvedForBackend(scheduler, backend->name())),
      authenticator_(authenticator),
      transfer_{registry, metrics, limits.max_message_bytes,
                [this](const grpc::ServerContextBase& context) { return Authenticate(context); },
                [this] { return AdmissionStatus(); }, &backend->capabilities(),
                limits.import_idle_timeout, &timer_, limits.forward_stream_idle_timeout},
      retained_(std::make_shared<RetainedOutputs>(
          limits.max_retained_output_bytes,
          registry->tenant_quotas().max_retained_output_bytes)) {
  // The indices of attention_service.proto's methods, in gRPC's generated order.
  ServeUnary(0, Rpc::kConfigure, &AttentionServiceImpl::HandleConfigure);
  ServeUnary(1, Rpc::kForward, &AttentionServiceImpl::HandleForward);
  ServeUnary(2, Rpc::kDecode, &AttentionServiceImpl::HandleDecode);
  ServeUnary(4, Rpc::kFork, &AttentionServiceImpl::HandleFork);
  ServeUnary(5, Rpc::kRelease, &AttentionServiceImpl::HandleRelease);
  ServeUnary(6, Rpc::kGetSession, &AttentionServiceImpl::HandleGetSession);
  ServeUnary(7, Rpc::kListSessions, &AttentionServiceImpl::HandleListSessions);
  ServeUnary(8, Rpc::kGetServerInfo, &AttentionServiceImpl::HandleGetServerInfo);
  RegisterStreamMethod(9, [this](grpc::CallbackServerContext* context) {
    return StartExportRequest(transfer_, context);
  });
}

// ---- The wire ----------------------------------------------------------------------------------

void AttentionServiceImpl::RegisterStreamMethod(
    int index, std::function<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*(
                   grpc::CallbackServerContext*)>
                   factory) {
  using StreamHandler = grpc::internal::CallbackBidiHandler<grpc::ByteBuffer, grpc::ByteBuffer>;
  // MarkMethodStreamed makes it BIDI_STREAMING (the core surfaces the call at its metadata, not
  // after reading its request); MarkMethodRawCallback then serves it on the callback API. Each
  // takes ownership of its handler, and the first is replaced by the second.
  MarkMethodStreamed(index, new StreamHandler(factory));
  MarkMethodRawCallback(index, new StreamHandler(std::move(factory)));
}

template <typename Request, typename Response>
void AttentionServiceImpl::ServeUnary(int index, Rpc rpc, Handler<Request, Response> handler) {
  RegisterStreamMethod(index, [this, rpc, handler](grpc::CallbackServerContext* context) {
    using Call = StreamedUnaryCall<Request, Response>;
    auto* call = new Call(context, limits_.max_message_bytes);
    auto refuse = [this, rpc](UnaryCall* refused, grpc::Status status) {
      FinishCall(refused, *metrics_, rpc, kNoVariant, CallTimer(), std::move(status));
    };
    // From the metadata alone: a caller without a valid token learns nothing, not even what
    // parses, and costs no more than its headers (the request is never read).
    absl::StatusOr<Principal> caller = Authenticate(*context);
    if (!caller.ok()) {
      refuse(call, ToGrpc(caller.status()));
      return call->reactor();
    }
    const bool changes_sessions = rpc != Rpc::kGetSession && rpc != Rpc::kListSessions &&
                                  rpc != Rpc::kGetServerInfo;
    if (grpc::Status admitted = AdmissionStatus();
        !admitted.ok() && (changes_sessions || stopping_.load())) {
      refuse(call, std::move(admitted));
      return call->reactor();
    }
    call->ReadRequest(
        [this, handler, caller = *std::move(caller)](Call& read) {
          (this->*handler)(read.context(), caller, read.request(), read.response(), &read);
        },
        std::move(refuse));
    return call->reactor();
  });
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AttentionServiceImpl::ForwardStream(
    grpc::CallbackServerContext* context) {
  return StartForwardStream(transfer_, context);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* AttentionServiceImpl::ImportRequest(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return StartImportRequest(transfer_, context, response);
}

// ---- Configure ---------------------------------------------------------------------------------

absl::Status AttentionServiceImpl::DoConfigure(const v1::ConfigureRequest& request,
                                               v1::ConfigureResponse* response,
                                               std::string* variant,
                                               const std::function<bool()>& cancelled,
                                               const Principal& owner,
                                               const std::string& session_id) {
  // Fail fast before loading weights (the owner's session quota too); Add() checks again.
  if (absl::Status s = registry_->CheckCapacity(owner, 0); !s.ok()) return s;
  // A hybrid stack (server/session/stack_config.h): its layers' specs; the session's is layer 0's.
  absl::StatusOr<std::vector<LayerSpec>> stack =
      ResolveStackSpecs(request, limits_.checkpoint_root);
  if (!stack.ok()) return stack.status();
  absl::StatusOr<LayerSpec> spec = stack->empty()
                                       ? ResolveConfigureSpec(request, limits_.checkpoint_root)
                                       : StackSessionSpec(*stack);
  if (!spec.ok()) return spec.status();
  *variant = VariantLabel(*spec);

  DType kv_dtype = DType::kF32;
  if (request.kv_cache_dtype() != v1::DTYPE_UNSPECIFIED) {
    absl::StatusOr<DType> d = DTypeFromProto(request.kv_cache_dtype(), "kv_cache_dtype");
    if (!d.ok()) return d.status();
    kv_dtype = *d;
  }
  // 8-bit pages hold codes with per-page scales (kernels/kv/quantization.h), not a DType.
  KvStorageFormat kv_storage = kv_dtype;
  if (request.kv_cache_quantization() != v1::KV_CACHE_QUANTIZATION_NONE) {
    absl::StatusOr<KvQuantization> q = KvQuantizationFromProto(request.kv_cache_quantization());
    if (!q.ok()) return q.status();
    if (request.kv_cache_dtype() != v1::DTYPE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_cache_quantization = ", KvQuantizationName(*q), " with kv_cache_dtype = ",
          DTypeName(kv_dtype), ": an 8-bit KV cache stores codes and per-page scales, not a "
          "dtype; leave kv_cache_dtype unset"));
    }
    kv_storage = KvStorageFormat::Quantized(*q);
  }
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size = ", request.page_size(), ", must be >= 0 (0 = default)"));
  }
  const int page_size = request.page_size() == 0 ? DefaultPageSize(*spec) : request.page_size();

  SessionLimits limits{limits_.max_requests_per_session, limits_.max_sequence_length};
  if (request.max_requests() < 0 || request.max_requests() > limits_.max_requests_per_session) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_requests = ", request.max_requests(), ", must be in [0, ",
        limits_.max_requests_per_session, "] (the server's max_requests_per_session)"));
  }
  if (request.max_requests() > 0) limits.max_requests = request.max_requests();
  if (request.max_sequence_length() < 0 ||
      request.max_sequence_length() > limits_.max_sequence_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_sequence_length = ", request.max_sequence_length(), ", must be in [0, ",
                     limits_.max_sequence_length, "] (the server's max_sequence_length)"));
  }
  if (request.max_sequence_length() > 0) limits.max_sequence_length = request.max_sequence_length();
  if (request.label().size() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("label: has ", request.label().size(), " bytes, at most 1024 allowed"));
  }

  // A non-admin tenant's pages are charged to its KV quota, which charges the pool in turn.
  const int64_t tenant_kv_bytes = registry_->tenant_quotas().max_kv_bytes;
  absl::StatusOr<KvCacheConfig> kv_config = pool_->ConfigFor(
      *spec, kv_storage, page_size,
      owner.is_admin || tenant_kv_bytes <= 0 ? nullptr
                                             : pool_->TenantBudget(owner.tenant, tenant_kv_bytes));
  if (!kv_config.ok()) return kv_config.status();
  // The owner's parameter quota counts what the layer keeps: checked before anything is allocated
  // against the fp32 bound (no backend keeps more), and again, atomically, by Add() with the bytes
  // the built layer reports (16-bit weights on CUDA take half).
  const int64_t fp32_parameter_bytes =
      stack->empty() ? LayerParameterBytes(*spec) : StackParameterBytes(*stack);
  if (absl::Status s = registry_->CheckCapacity(owner, fp32_parameter_bytes); !s.ok()) {
    return s;
  }
  // Budgeted from the spec alone, before a byte is allocated: the peak while the loaded weights
  // and the layer's copy coexist, then what the layer keeps. A conversion also holds the MHA
  // layer's weights while it pools them.
  int64_t peak_bytes =
      stack->empty() ? ConfigurePeakParameterBytes(*spec) : StackPeakParameterBytes(*stack);
  const int64_t parameter_count =
      stack->empty() ? ParameterCount(*spec) : StackParameterCount(*stack);
  if (request.weights().source_case() == v1::WeightSource::kConvertFrom) {
    if (absl::StatusOr<LayerSpec> mha = MhaSourceSpec(*spec); mha.ok()) {
      peak_bytes += LayerParameterBytes(*mha);
    }
  }
  absl::StatusOr<ParameterCharge> parameters = parameters_->Charge(
      peak_bytes,
      absl::StrCat(stack->empty() ? "this layer (" : "this stack (", parameter_count,
                   " parameters, while being built)"));
  if (!parameters.ok()) return parameters.status();
  const auto abandoned = [&cancelled] {
    return absl::CancelledError("Configure cancelled or past its deadline; nothing was kept");
  };
  if (cancelled()) return abandoned();
  absl::StatusOr<LayerWeights> weights =
      !stack->empty() ? absl::StatusOr<LayerWeights>(LayerWeights())  // BuildStack loads them.
      : request.weights().source_case() == v1::WeightSource::kSeed
          ? SeededWeights(request.weights().seed(), *spec, cancelled)
          : WeightsFromProto(request.weights(), *spec, {limits_.checkpoint_root});
  if (!weights.ok()) return cancelled() ? abandoned() : weights.status();
  if (cancelled()) return abandoned();
  std::string stack_fingerprint;
  std::shared_ptr<StackKvUsage> stack_kv;
  absl::StatusOr<std::unique_ptr<AttentionLayer>> layer =
      stack->empty() ? backend_->CreateLayer(*spec, *weights, *kv_config)
                     : BuildStack(request, *stack, *backend_, *kv_config, limits_.checkpoint_root,
                                  cancelled, &stack_fingerprint, &stack_kv);
  if (!layer.ok()) return layer.status();
  // A model session's calls name one of its layers (BuildStack made a per-layer LayerStack).
  LayerStack* model =
      request.stack().per_layer() ? static_cast<LayerStack*>(layer->get()) : nullptr;
  // Before the weights go: what an import into this session must match (ImportRequest).
  std::string fingerprint = LayerFingerprint(*spec, kv_config->storage, page_size, *weights);
  if (!stack->empty()) fingerprint = stack_fingerprint;
  weights->clear();  // The layer holds its own copy in its compute dtype.
  const int64_t kept_parameter_bytes = (*layer)->ParameterBytes();
  parameters->ShrinkTo(kept_parameter_bytes);
  if (cancelled()) return abandoned();

  const KvPoolUsage usage = (*layer)->PoolUsage();
  SessionCost cost;
  cost.parameter_count = parameter_count;
  cost.parameter_bytes = kept_parameter_bytes;  // As the backend holds them.
  // Exact for plain pages; 8-bit pages add their scales, page_bytes / page_size rounded up.
  cost.kv_bytes_per_token = stack->empty() ? KvBytesPerTokenOf(*spec, kv_storage, page_size)
                                            : StackKvBytesPerToken(*stack, kv_storage, page_size);
  cost.page_bytes = usage.page_bytes;
  cost.max_context_tokens = stack->empty()
                                ? pool_->free_bytes() / usage.page_bytes * usage.page_size
                                : MaxContextTokens(**layer, pool_->free_bytes());

  // Every engine call of the session (a decode batch, a whole Forward) feeds the batch metrics.
  SchedulerContext scheduling{
      scheduler_options_, &timer_,
      [metrics = metrics_, variant = *variant](const Session&, const BatchStats& b) {
        metrics->ObserveBatch(variant, b.decode, b.size, b.tokens,
                              static_cast<double>(b.compute_ns) * 1e-9);
      }};
  auto session =
      std::make_shared<Session>(session_id, request.label(), *spec, kv_dtype, limits,
                                *std::move(layer), cost, executor_, std::move(scheduling));
  session->HoldParameters(*std::move(parameters));
  session->SetRetainedOutputs(retained_, owner.tenant, !owner.is_admin);
  session->SetFingerprint(fingerprint);
  session->SetVariantLabel(*variant);
  if (keep_configure_requests_) {
    // What a drain sends its peer to re-create this session: the request as given, with a single
    // layer's spec as resolved (a checkpoint's config.json read here need not be read there
    // again). A stack's request stays as given: `spec` and `stack` exclude each other.
    v1::ConfigureRequest recreate = request;
    if (!request.has_stack()) *recreate.mutable_spec() = LayerSpecToProto(*spec);
    session->SetConfigureRequest(recreate.SerializeAsString());
  }
  if (stack_kv != nullptr) session->SetStack(stack_kv, static_cast<int>(stack->size()));
  session->SetModel(model);
  if (absl::Status s = registry_->Add(session, owner, kept_parameter_bytes); !s.ok()) {
    return s;
  }
  response->set_session_id(session->id());
  *response->mutable_spec() = LayerSpecToProto(*spec);
  response->set_replica(replica());
  *response->mutable_cost() = SessionCostToProto(cost);
  response->set_fingerprint(fingerprint);
  for (const LayerSpec& layer_spec : *stack) *response->add_stack() = LayerSpecToProto(layer_spec);
  SERVER_LOG(INFO, "session %s configured: %s, kv %s, page_size %d", session->id(),
             LayerSpecSummary(*spec), KvStorageFormatName(kv_storage), page_size);
  return absl::OkStatus();
}

void AttentionServiceImpl::HandleConfigure(grpc::CallbackServerContext* context,
                                           const Principal& caller,
                                           const v1::ConfigureRequest& request,
                                           v1::ConfigureResponse& response, UnaryCall* call) {
  auto timer = std::make_shared<CallTimer>();
  absl::StatusOr<std::string> session_id = SessionIdForConfigure(*context);
  if (!session_id.ok()) {
    return FinishCall(call, *metrics_, Rpc::kConfigure, kNoVariant, *timer,
                      ToGrpc(session_id.status()));
  }
  // Loading a checkpoint and building a layer are compute: do them on the executor.
  const bool queued = executor_->Submit([this, context, caller, &request, &response, call, timer,
                                         session_id = *std::move(session_id)] {
    if (context->IsCancelled()) {
      return FinishCall(call, *metrics_, Rpc::kConfigure, kNoVariant, *timer, Cancelled());
    }
    timer->Started();
    std::string variant = kNoVariant;
    absl::Status status;
    try {
      status = DoConfigure(
          request, &response, &variant, [context] { return context->IsCancelled(); }, caller,
          session_id);
    } catch (const std::bad_alloc&) {
      // What DoConfigure took (the parameter charge, the layer) is given back as it unwinds; the
      // session is registered only at its end.
      response.Clear();
      status = OutOfMemoryError("this Configure");
    }
    timer->compute_ns = NanosSince(timer->start);
    if (status.ok()) timer->Fill(response.mutable_timing());
    if (status.ok() && context->client_metadata().count(kMovedSessionMetadataKey) > 0) {
      // Re-created by a draining replica: it may go home later (server/fleet/session_rebalancer.h).
      if (absl::StatusOr<std::shared_ptr<Session>> s = registry_->Find(session_id, caller); s.ok()) {
        (*s)->MarkAdopted();
      }
    }
    FinishCall(call, *metrics_, Rpc::kConfigure, variant, *timer, ToGrpc(status));
  });
  if (!queued) FinishCall(call, *metrics_, Rpc::kConfigure, kNoVariant, *timer, ShuttingDown());
}

// ---- Forward / Decode --------------------------------------------------------------------------

void AttentionServiceImpl::HandleForward(grpc::CallbackServerContext* context,
                                         const Principal& caller, const v1::ForwardRequest& request,
                                         v1::ForwardResponse& response, UnaryCall* call) {
  CallTimer timer;
  Metrics& metrics = *metrics_;
  absl::Status ids = CheckIdLength(request.session_id(), "session_id", kMaxSessionIdBytes);
  if (ids.ok()) ids = CheckIdLength(request.call_id(), "call_id", kMaxCallIdBytes);
  // Refused here, not in its turn: an op naming no request is an op on every request to the
  // scheduler (a whole-session Release), so posting it would flush the batch being formed for a
  // call that then fails.
  if (ids.ok() && request.items_size() == 0) {
    ids = absl::InvalidArgumentError("items: must not be empty");
  }
  if (!ids.ok()) {
    FinishCall(call, metrics, Rpc::kForward, kNoVariant, timer, ToGrpc(ids));
    return;
  }
  absl::StatusOr<std::shared_ptr<Session>> session = registry_->Find(request.session_id(), caller);
  if (!session.ok()) {
    FinishCall(call, metrics, Rpc::kForward, kNoVariant, timer, ToGrpc(session.status()));
    return;
  }
  std::string variant = (*session)->variant_label();
  if (absl::Status s = (*session)->CheckLayer(request.layer()); !s.ok()) {
    FinishCall(call, metrics, Rpc::kForward, variant, timer, ToGrpc(s));
    return;
  }
  // The session's scheduler runs it in its turn (ordered against decode steps of the same
  // requests, see SessionScheduler::SubmitForward); `done` answers the call.
  auto forward = std::make_unique<ForwardCall>();
  forward->layer = request.layer();
  for (const v1::ForwardItem& item : request.items()) {
    forward->request_ids.push_back(item.request_id());
  }
  forward->call_id = request.call_id();
  forward->arrival = timer.arrival;
  forward->is_cancelled = [context] { return context->IsCancelled(); };
  forward->read_inputs = [session = *session, &request,
                          max_message_bytes = limits_.max_message_bytes]()
      -> absl::StatusOr<std::vector<StepInput>> {
    absl::StatusOr<std::vector<StepInput>> inputs =
        ForwardInputsFromProto(request, session->spec());
    if (inputs.ok()) {
      if (absl::Status s = CheckResponseFits(*inputs, max_message_bytes); !s.ok()) return s;
    }
    return inputs;
  };
  forward->done = [&response, call, timer, &metrics, variant](
                      absl::StatusOr<std::vector<StepOutput>> outputs,
                      const StepTiming& timing) mutable {
    if (timing.reached_turn) ApplyStepTiming(timing, timer);
    if (outputs.ok()) {
      try {
        for (StepOutput& out : *outputs) FillResult(out, response.add_results());
        timer.Fill(response.mutable_timing());
      } catch (const std::bad_alloc&) {
        // Applied, but its answer cannot be built: a retry under its call_id gets the output.
        response.Clear();
        outputs = OutOfMemoryError("the response of this Forward");
      }
    }
    FinishCall(call, metrics, Rpc::kForward, variant, timer, ToGrpc(outputs.status()));
  };
  (*session)->scheduler().SubmitForward(std::move(forward));
}

namespace {

// Validates one Decode call (or DecodeStream message) against its session: the steps that join
// the session's next batch, or the call's error.
absl::StatusOr<std::unique_ptr<DecodeCall>> DecodeCallFromProto(const v1::DecodeRequest& request,
                                                                const Session& session,
                                                                int64_t max_message_bytes) {
  if (absl::Status s = CheckIdLength(request.call_id(), "call_id", kMaxCallIdBytes); !s.ok()) {
    return s;
  }
  if (absl::Status s = session.CheckLayer(request.layer()); !s.ok()) return s;
  absl::StatusOr<std::vector<StepInput>> inputs = DecodeInputsFromProto(request, session.spec());
  if (!inputs.ok()) return inputs.status();
  if (absl::Status s = CheckResponseFits(*inputs, max_message_bytes); !s.ok()) return s;
  auto call = std::make_unique<DecodeCall>();
  call->inputs = *std::move(inputs);
  call->call_id = request.call_id();
  call->layer = request.layer();
  return call;
}

}  // namespace

void AttentionServiceImpl::HandleDecode(grpc::CallbackServerContext* context,
                                        const Principal& caller, const v1::DecodeRequest& request,
                                        v1::DecodeResponse& response, UnaryCall* call) {
  CallTimer timer;
  Metrics& metrics = *metrics_;
  if (absl::Status s = CheckIdLength(request.session_id(), "session_id", kMaxSessionIdBytes);
      !s.ok()) {
    FinishCall(call, metrics, Rpc::kDecode, kNoVariant, timer, ToGrpc(s));
    return;
  }
  absl::StatusOr<std::shared_ptr<Session>> session = registry_->Find(request.session_id(), caller);
  if (!session.ok()) {
    FinishCall(call, metrics, Rpc::kDecode, kNoVariant, timer, ToGrpc(session.status()));
    return;
  }
  std::string variant = (*session)->variant_label();
  absl::StatusOr<std::unique_ptr<DecodeCall>> steps =
      DecodeCallFromProto(request, **session, limits_.max_message_bytes);
  if (!steps.ok()) {
    FinishCall(call, metrics, Rpc::kDecode, variant, timer, ToGrpc(steps.status()));
    return;
  }
  // The steps join the session's next decode batch; `done` answers the call.
  (*steps)->arrival = timer.arrival;
  (*steps)->is_cancelled = [context] { return context->IsCancelled(); };
  (*steps)->done = [&response, call, timer, &metrics, variant](
                       absl::StatusOr<std::vector<StepOutput>> outputs,
                       const StepTiming& timing) mutable {
    ApplyStepTiming(timing, timer);
    if (outputs.ok()) {
      try {
        FillDecodeResponse(*outputs, timer, &response);
      } catch (const std::bad_alloc&) {
        response.Clear();
        outputs = OutOfMemoryError("the response of this Decode");
      }
    }
    FinishCall(call, metrics, Rpc::kDecode, variant, timer, ToGrpc(outputs.status()));
  };
  (*session)->scheduler().SubmitDecode(*std::move(steps));
}

// ---- DecodeStream ------------------------------------------------------------------------------

// One message at a time: read -> compute on the session's queue -> write -> read. Responses are
// therefore in request order, and at most one step per stream is in flight. The first failing
// message ends the stream with its status (earlier responses stand; later messages are not read);
// a message that does not parse is such a failure (INVALID_ARGUMENT), never a silent end.
// Each message names its session, so one stream may drive several sessions.
class AttentionServiceImpl::DecodeStreamReactor
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  DecodeStreamReactor(AttentionServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    // Once per stream: the caller's messages may only name its own sessions.
    absl::StatusOr<Principal> caller = service_->Authenticate(*context_);
    if (!caller.ok()) {
      FinishMessage(ToGrpc(caller.status()));
      return;
    }
    caller_ = *std::move(caller);
    if (service_->stopping_.load()) {
      FinishMessage(service_->AdmissionStatus());
      return;
    }
    StartRead(&wire_request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // Client half-closed (or the call broke): every message so far has been answered.
      Finish(context_->IsCancelled() ? Cancelled() : grpc::Status::OK);
      return;
    }
    timer_ = CallTimer();
    variant_ = kNoVariant;
    if (!ParseMessage(wire_request_, &request_)) {
      FinishMessage(UnparseableMessage(request_, wire_request_.Length()));
      return;
    }
    wire_request_.Clear();
    if (grpc::Status draining = service_->DrainingStatus(); !draining.ok()) {
      FinishMessage(std::move(draining));
      return;
    }
    if (absl::Status s = CheckIdLength(request_.session_id(), "session_id", kMaxSessionIdBytes);
        !s.ok()) {
      FinishMessage(ToGrpc(s));
      return;
    }
    absl::StatusOr<std::shared_ptr<Session>> session =
        service_->registry_->Find(request_.session_id(), caller_);
    if (!session.ok()) {
      FinishMessage(ToGrpc(session.status()));
      return;
    }
    variant_ = (*session)->variant_label();
    absl::StatusOr<std::unique_ptr<DecodeCall>> steps =
        DecodeCallFromProto(request_, **session, service_->limits_.max_message_bytes);
    if (!steps.ok()) {
      FinishMessage(ToGrpc(steps.status()));
      return;
    }
    // The step joins the session's next decode batch; `done` writes the response (or ends the
    // stream), and the next message is read once the write is done.
    (*steps)->arrival = timer_.arrival;
    (*steps)->is_cancelled = [context = context_] { return context->IsCancelled(); };
    (*steps)->done = [this](absl::StatusOr<std::vector<StepOutput>> outputs,
                            const StepTiming& timing) {
      ApplyStepTiming(timing, timer_);
      if (!outputs.ok()) return FinishMessage(ToGrpc(outputs.status()));
      response_.Clear();
      FillDecodeResponse(*outputs, timer_, &response_);
      grpc::Status serialized =
          reply_.Serialize(response_, service_->limits_.max_message_bytes, &wire_response_);
      if (!serialized.ok()) return FinishMessage(std::move(serialized));
      Observe(*service_->metrics_, Rpc::kDecodeStream, variant_, grpc::Status::OK, timer_);
      StartWrite(&wire_response_);
    };
    (*session)->scheduler().SubmitDecode(*std::move(steps));
  }

  void OnWriteDone(bool ok) override {
    // Our reference to the reply's bytes: without it, the next reply reuses them as soon as
    // gRPC lets go (server/rpc/reply_buffer.h).
    wire_response_.Clear();
    if (!ok) {
      Finish(Cancelled());
      return;
    }
    StartRead(&wire_request_);
  }

  void OnDone() override { delete this; }

 private:
  // Ends the stream at the current message with `status`, reporting that message to metrics.
  void FinishMessage(grpc::Status status) {
    Observe(*service_->metrics_, Rpc::kDecodeStream, variant_, status, timer_);
    if (!status.ok()) {
      LogFailedCall(RpcLabel(Rpc::kDecodeStream), context_->peer(),
                    static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    }
    Finish(std::move(status));
  }

  AttentionServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer wire_request_;
  grpc::ByteBuffer wire_response_;
  // Per stream and reused, so that a message allocates no request or reply of its own: the
  // parsed request and built response (Clear keeps their fields' memory) and the reply's bytes.
  v1::DecodeRequest request_;
  v1::DecodeResponse response_;
  ReplyBuffer reply_;
  CallTimer timer_;
  std::string variant_ = kNoVariant;  // Of the current message's session, for metrics.
  Principal caller_;
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AttentionServiceImpl::DecodeStream(
    grpc::CallbackServerContext* context) {
  return new DecodeStreamReactor(this, context);
}

// ---- Release, sessions, server ------------------------------------------------------------------

void AttentionServiceImpl::HandleRelease(grpc::CallbackServerContext* context,
                                         const Principal& caller, const v1::ReleaseRequest& request,
                                         v1::ReleaseResponse& response, UnaryCall* call) {
  CallTimer timer;
  Metrics& metrics = *metrics_;
  // Both ids bounded as every other RPC bounds them, before either is looked up or echoed.
  absl::Status ids = CheckIdLength(request.session_id(), "session_id", kMaxSessionIdBytes);
  if (ids.ok()) ids = CheckIdLength(request.request_id(), "request_id", kMaxRequestIdBytes);
  if (!ids.ok()) {
    FinishCall(call, metrics, Rpc::kRelease, kNoVariant, timer, ToGrpc(ids));
    return;
  }
  absl::StatusOr<std::shared_ptr<Session>> found = registry_->Find(request.session_id(), caller);
  if (!found.ok()) {
    FinishCall(call, metrics, Rpc::kRelease, kNoVariant, timer, ToGrpc(found.status()));
    return;
  }
  std::shared_ptr<Session> session = *found;
  std::string variant = session->variant_label();
  bool queued;
  if (request.request_id().empty()) {
    // Unlisted now, so no new call finds it; freed on its queue behind the calls already there.
    if (registry_->Remove(session) == nullptr) {
      FinishCall(
          call, metrics, Rpc::kRelease, variant, timer,
          ToGrpc(absl::NotFoundError(absl::StrCat("session_id: session '", request.session_id(),
                                                  "' was released concurrently"))));
      return;
    }
    queued = session->scheduler().PostOp({}, [session, &response, call, timer, &metrics, variant] {
      CallTimer t = timer;
      t.Started();
      response.set_freed_bytes(session->Close());
      t.compute_ns = NanosSince(t.start);
      SERVER_LOG(INFO, "session %s released; freed %d KV bytes", session->id(),
                 response.freed_bytes());
      FinishCall(call, metrics, Rpc::kRelease, variant, t, grpc::Status::OK);
    });
  } else {
    // Not skipped when cancelled: the client asked for memory back.
    queued = session->scheduler().PostOp(
        {request.request_id()}, [session, &request, &response, call, timer, &metrics, variant] {
          CallTimer t = timer;
          t.Started();
          absl::StatusOr<int64_t> freed = session->ReleaseRequest(request.request_id());
          t.compute_ns = NanosSince(t.start);
          if (freed.ok()) response.set_freed_bytes(*freed);
          FinishCall(call, metrics, Rpc::kRelease, variant, t, ToGrpc(freed.status()));
        });
  }
  if (!queued) FinishCall(call, metrics, Rpc::kRelease, variant, timer, ShuttingDown());
}

void AttentionServiceImpl::HandleFork(grpc::CallbackServerContext* context, const Principal& caller,
                                      const v1::ForkRequest& request, v1::ForkResponse& response,
                                      UnaryCall* call) {
  CallTimer timer;
  Metrics& metrics = *metrics_;
  absl::Status checked = CheckIdLength(request.session_id(), "session_id", kMaxSessionIdBytes);
  if (checked.ok()) checked = CheckIdLength(request.request_id(), "request_id", kMaxRequestIdBytes);
  for (int i = 0; checked.ok() && i < request.new_request_ids_size(); ++i) {
    checked = CheckIdLength(request.new_request_ids(i), absl::StrCat("new_request_ids[", i, "]"),
                            kMaxRequestIdBytes);
  }
  // A backend without prefix sharing refuses here, naming itself, before any session is touched.
  if (checked.ok()) checked = CheckOperation(backend_->capabilities(), LayerOperation::kFork);
  if (!checked.ok()) {
    FinishCall(call, metrics, Rpc::kFork, kNoVariant, timer, ToGrpc(checked));
    return;
  }
  absl::StatusOr<std::shared_ptr<Session>> found = registry_->Find(request.session_id(), caller);
  if (!found.ok()) {
    FinishCall(call, metrics, Rpc::kFork, kNoVariant, timer, ToGrpc(found.status()));
    return;
  }
  std::shared_ptr<Session> session = *found;
  std::string variant = session->variant_label();
  std::vector<std::string> touched(request.new_request_ids().begin(),
                                   request.new_request_ids().end());
  touched.push_back(request.request_id());
  // Ordered after the source's steps that arrived before it, so the forks share what they cached.
  const bool queued = session->scheduler().PostOp(
      std::move(touched), [session, &request, &response, call, timer, &metrics, variant] {
        CallTimer t = timer;
        t.Started();
        std::vector<std::string> ids(request.new_request_ids().begin(),
                                     request.new_request_ids().end());
        absl::StatusOr<ForkOutcome> forked = session->Fork(request.request_id(), ids);
        t.compute_ns = NanosSince(t.start);
        if (forked.ok()) {
          for (const std::string& id : ids) {
            v1::ForkResult* result = response.add_results();
            result->set_request_id(id);
            result->set_sequence_length(forked->sequence_length);
          }
          response.set_kv_bytes_added(forked->kv_bytes_added);
        }
        FinishCall(call, metrics, Rpc::kFork, variant, t, ToGrpc(forked.status()));
      });
  if (!queued) FinishCall(call, metrics, Rpc::kFork, variant, timer, ShuttingDown());
}

void AttentionServiceImpl::HandleGetSession(grpc::CallbackServerContext* context,
                                            const Principal& caller,
                                            const v1::GetSessionRequest& request,
                                            v1::GetSessionResponse& response, UnaryCall* call) {
  const CallTimer timer;
  absl::StatusOr<std::shared_ptr<Session>> session = nullptr;
  if (absl::Status s = CheckIdLength(request.session_id(), "session_id", kMaxSessionIdBytes);
      !s.ok()) {
    session = s;
  } else {
    session = registry_->Find(request.session_id(), caller);
  }
  if (session.ok()) {
    SessionSnapshotToProto((*session)->Snapshot(absl::Now(), true), response.mutable_session());
  }
  FinishCall(call, *metrics_, Rpc::kGetSession,
             session.ok() ? (*session)->variant_label() : kNoVariant, timer,
             ToGrpc(session.status()));
}

void AttentionServiceImpl::HandleListSessions(grpc::CallbackServerContext* context,
                                              const Principal& caller,
                                              const v1::ListSessionsRequest& request,
                                              v1::ListSessionsResponse& response, UnaryCall* call) {
  const CallTimer timer;
  const absl::Time now = absl::Now();
  for (const std::shared_ptr<Session>& session : registry_->All(caller)) {
    SessionSnapshotToProto(session->Snapshot(now, false), response.add_sessions());
  }
  FinishCall(call, *metrics_, Rpc::kListSessions, kNoVariant, timer, grpc::Status::OK);
}

void AttentionServiceImpl::SetReplica(std::string replica) {
  absl::MutexLock lock(&replica_mu_);
  replica_ = std::move(replica);
}

void AttentionServiceImpl::StartDraining(std::string peer) {
  absl::MutexLock lock(&replica_mu_);
  drain_peer_ = std::move(peer);
  draining_.store(true);
}

grpc::Status AttentionServiceImpl::DrainingStatus() const {
  if (!draining_.load(std::memory_order_relaxed)) return grpc::Status::OK;
  absl::MutexLock lock(&replica_mu_);
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      absl::StrCat("replica '", replica_, "' is draining (shutting down): its "
                                   "sessions are moving to ", drain_peer_,
                                   "; retry, through the balancer, in a moment"));
}

grpc::Status AttentionServiceImpl::AdmissionStatus() const {
  if (stopping_.load()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the server is shutting down (SIGTERM) and takes no new calls; retry, "
                        "through the balancer or on another replica");
  }
  return DrainingStatus();
}

std::string AttentionServiceImpl::replica() const {
  absl::MutexLock lock(&replica_mu_);
  return replica_;
}

void AttentionServiceImpl::HandleGetServerInfo(grpc::CallbackServerContext* context,
                                               const Principal& caller,
                                               const v1::GetServerInfoRequest& request,
                                               v1::GetServerInfoResponse& response,
                                               UnaryCall* call) {
  const CallTimer timer;
  response.set_version(ATTNSERVE_VERSION);
  response.set_replica(replica());
  response.set_authentication(authenticator_ != nullptr && authenticator_->enabled());
  response.set_caller_tenant(caller.tenant);
  response.set_caller_is_admin(caller.is_admin);
  response.set_backend(std::string(backend_->name()));
  response.set_device(backend_->device_description());
  response.set_kv_pool_capacity_bytes(pool_->capacity_bytes());
  response.set_kv_pool_used_bytes(pool_->used_bytes());
  int requests = 0;
  // The caller's own sessions (all of them for the admin); the pool figures are the device's.
  const std::vector<std::shared_ptr<Session>> sessions = registry_->All(caller);
  for (const std::shared_ptr<Session>& session : sessions) requests += session->num_requests();
  response.set_sessions(static_cast<int32_t>(sessions.size()));
  response.set_requests(requests);
  v1::Limits* limits = response.mutable_limits();
  limits->set_max_sessions(limits_.max_sessions);
  limits->set_max_requests_per_session(limits_.max_requests_per_session);
  limits->set_max_sequence_length(limits_.max_sequence_length);
  limits->set_max_message_bytes(limits_.max_message_bytes);
  limits->set_request_ttl_ns(absl::ToInt64Nanoseconds(limits_.request_ttl));
  limits->set_session_ttl_ns(absl::ToInt64Nanoseconds(limits_.session_ttl));
  limits->set_max_parameter_bytes(parameters_->capacity_bytes());
  response.set_parameter_bytes_used(parameters_->used_bytes());
  *response.mutable_capabilities() = CapabilitiesToProto(backend_->capabilities());
  FinishCall(call, *metrics_, Rpc::kGetServerInfo, kNoVariant, timer, grpc::Status::OK);
}

}  // namespace attnserve::server

#include "server/rpc/request_transfer.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/kv/quantization.h"
#include "kernels/kv/sequence_table.h"
#include "server/observability/call_log.h"
#include "server/observability/logging.h"
#include "server/rpc/step_codec.h"
#include "server/rpc/wire_call.h"
#include "server/session/layer_fingerprint.h"
#include "server/session/scheduler.h"
#include "server/session/session.h"

namespace attnserve::server {

namespace {

using Clock = std::chrono::steady_clock;

// Room left under the message limit for the framing around one chunk's bytes.
constexpr int64_t kChunkHeadroomBytes = 1024;

// Reports one finished transfer call to metrics (and a refusal for KV memory).
void Observe(Metrics& metrics, Rpc rpc, const std::string& variant, const grpc::Status& status,
             Clock::time_point arrival, int64_t compute_ns) {
  RpcTiming timing;
  timing.computed = compute_ns > 0;
  timing.compute_seconds = static_cast<double>(compute_ns) * 1e-9;
  timing.total_seconds = std::chrono::duration<double>(Clock::now() - arrival).count();
  ObserveCall(metrics, rpc, variant, status, timing);
}

}  // namespace

v1::ExportedRequest ExportedRequestHeader(const Session& session, const RequestExport& exported) {
  v1::ExportedRequest header;
  header.set_fingerprint(session.fingerprint());
  header.set_kv_format(KvStorageFormatName(session.kv_storage()));
  header.set_page_size(static_cast<int32_t>(session.page_size()));
  header.set_page_bytes(exported.kv.page_bytes);
  header.set_sequence_length(exported.kv.num_tokens);
  header.set_last_position(exported.last_position);
  header.set_first_held_page(exported.kv.first_held_page);
  header.set_held_pages(exported.kv.page_bytes == 0
                            ? 0
                            : static_cast<int64_t>(exported.kv.pages.size()) /
                                  exported.kv.page_bytes);
  for (const LayerExtent& part : exported.kv.layers) {
    v1::ExportedLayer* layer = header.add_layers();
    layer->set_sequence_length(part.num_tokens);
    layer->set_first_held_page(part.first_held_page);
    layer->set_held_pages(part.held_pages);
  }
  return header;
}

namespace {

// FAILED_PRECONDITION naming every way `header` does not fit `session`, or OK.
absl::Status CheckSameLayer(const v1::ExportedRequest& header, const Session& session) {
  std::string differs;
  const auto note = [&differs](absl::string_view what) {
    absl::StrAppend(&differs, differs.empty() ? "" : "; ", what);
  };
  if (header.fingerprint() != session.fingerprint()) {
    note(absl::StrCat("fingerprint ", HexBytes(header.fingerprint()), " != this session's ",
                      HexBytes(session.fingerprint()),
                      " (another layer spec, KV format, page size or weights)"));
  }
  const std::string format = KvStorageFormatName(session.kv_storage());
  if (header.kv_format() != format) {
    note(absl::StrCat("kv_format '", header.kv_format(), "' != this session's '", format, "'"));
  }
  if (header.page_size() != session.page_size()) {
    note(
        absl::StrCat("page_size ", header.page_size(), " != this session's ", session.page_size()));
  }
  if (header.page_bytes() != session.page_bytes()) {
    note(absl::StrCat("page_bytes ", header.page_bytes(), " != this session's ",
                      session.page_bytes()));
  }
  if (differs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the request was exported from a session unlike session '", session.id(), "': ", differs));
}

// INVALID_ARGUMENT unless the header's held pages fit its sequence_length: for one layer, and for
// each layer of a stack (whose count must be the session's, FAILED_PRECONDITION otherwise), the
// held pages are the pages of sequence_length tokens less the leading ones its window evicted.
absl::Status CheckHeldPages(const v1::ExportedRequest& request, const Session& session) {
  const int64_t length = request.sequence_length();
  const int64_t pages = PagesForTokens(length, static_cast<int>(request.page_size()));
  const auto fits = [&](absl::string_view field, int64_t sequence_length, int64_t first_held_page,
                        int64_t held_pages) -> absl::Status {
    if (sequence_length == length && first_held_page >= 0 && first_held_page <= pages &&
        held_pages == pages - first_held_page) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": sequence_length = ", sequence_length, ", first_held_page = ", first_held_page,
        " and held_pages = ", held_pages, " do not fit ", length, " tokens in pages of ",
        request.page_size(), " (", pages, " pages: held_pages = pages - first_held_page)"));
  };
  const int want_layers = session.stack_kv() != nullptr ? session.num_layers() : 0;
  if (request.layers_size() != want_layers) {
    return absl::FailedPreconditionError(
        absl::StrCat("header.request.layers: the request was exported with ", request.layers_size(),
                     " layer entries, session '", session.id(), "' ",
                     want_layers == 0 ? "holds one layer (no entries)"
                                      : absl::StrCat("holds a stack of ", want_layers, " layers")));
  }
  if (want_layers == 0) {
    return fits("header.request", length, request.first_held_page(), request.held_pages());
  }
  int64_t held = 0;
  for (int k = 0; k < request.layers_size(); ++k) {
    const v1::ExportedLayer& layer = request.layers(k);
    if (absl::Status s = fits(absl::StrCat("header.request.layers[", k, "]"),
                              layer.sequence_length(), layer.first_held_page(), layer.held_pages());
        !s.ok()) {
      return s;
    }
    held += layer.held_pages();
  }
  if (request.first_held_page() != 0 || request.held_pages() != held) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.request: first_held_page = ", request.first_held_page(), " and held_pages = ",
        request.held_pages(), "; a stack's must be 0 and the layers' sum (", held, ")"));
  }
  return absl::OkStatus();
}

// ---- ExportRequest -----------------------------------------------------------------------------

// A server-streaming method served as a bidi stream (StreamedUnaryCall in server/rpc/wire_call.h
// says why): the caller is authenticated from its metadata before its request is read.
class ExportReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ExportReactor(const TransferContext& context, grpc::CallbackServerContext* call)
      : context_(context), call_(call), peer_(call->peer()) {
    if (grpc::Status draining = context_.draining(); !draining.ok()) {
      Done(draining);
      return;
    }
    absl::StatusOr<Principal> caller = context_.authenticate(*call);
    if (!caller.ok()) {
      Done(ToGrpc(caller.status()));
      return;
    }
    caller_ = *std::move(caller);
    StartRead(&wire_request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      return Done(call_->IsCancelled() ? grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled")
                                       : MissingMessage(request_));
    }
    Start();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Done(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled"));
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  // Checks the request and posts the copy on the session's queue, or finishes the call.
  void Start() {
    const bool parsed = ParseMessage(wire_request_, &request_);
    const size_t num_bytes = wire_request_.Length();
    wire_request_.Clear();
    if (!parsed) return Done(UnparseableMessage(request_, num_bytes));
    absl::Status checked = CheckId(request_.session_id(), "session_id", kMaxSessionIdBytes);
    if (checked.ok()) checked = CheckId(request_.request_id(), "request_id", kMaxRequestIdBytes);
    if (checked.ok() && context_.capabilities != nullptr) {
      checked = CheckOperation(*context_.capabilities, LayerOperation::kExportImport);
    }
    if (!checked.ok()) return Done(ToGrpc(checked));
    if (request_.max_chunk_bytes() < 0) {
      return Done(ToGrpc(absl::InvalidArgumentError(absl::StrCat(
          "max_chunk_bytes = ", request_.max_chunk_bytes(), ", must be >= 0 (0 = server limit)"))));
    }
    absl::StatusOr<std::shared_ptr<Session>> session =
        context_.registry->Find(request_.session_id(), caller_);
    if (!session.ok()) return Done(ToGrpc(session.status()));
    session_ = *std::move(session);
    variant_ = session_->variant_label();
    chunk_bytes_ = std::max<int64_t>(1, context_.max_message_bytes - kChunkHeadroomBytes);
    if (request_.max_chunk_bytes() > 0) {
      chunk_bytes_ = std::min(chunk_bytes_, request_.max_chunk_bytes());
    }
    // In the request's turn on the session's queue: after its earlier steps, before later ones.
    const bool queued = session_->scheduler().PostOp({request_.request_id()}, [this] {
      const Clock::time_point start = Clock::now();
      absl::StatusOr<RequestExport> exported =
          session_->ExportRequest(request_.request_id(), request_.release_after_export());
      compute_ns_ =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
      if (!exported.ok()) return Done(ToGrpc(exported.status()));
      exported_ = *std::move(exported);
      SERVER_LOG(INFO, "request %s of session %s exported: %d tokens, %d page bytes%s",
                 request_.request_id(), session_->id(), exported_.kv.num_tokens,
                 exported_.kv.pages.size(), request_.release_after_export() ? ", released" : "");
      WriteNext();
    });
    if (!queued) Done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  }

  // The header first, then the page bytes in chunks; OK after the last.
  void WriteNext() {
    v1::ExportRequestResponse message;
    if (!header_sent_) {
      *message.mutable_header() = ExportedRequestHeader(*session_, exported_);
      header_sent_ = true;
    } else if (offset_ < exported_.kv.pages.size()) {
      const size_t n =
          std::min(exported_.kv.pages.size() - offset_, static_cast<size_t>(chunk_bytes_));
      message.mutable_pages()->set_data(exported_.kv.pages.substr(offset_, n));
      offset_ += n;
    } else {
      return Done(grpc::Status::OK);
    }
    grpc::Status serialized = SerializeMessage(message, context_.max_message_bytes, &wire_);
    if (!serialized.ok()) return Done(std::move(serialized));
    StartWrite(&wire_);
  }

  void Done(grpc::Status status) {
    Observe(*context_.metrics, Rpc::kExportRequest, variant_, status, arrival_, compute_ns_);
    if (!status.ok()) {
      LogFailedCall(RpcLabel(Rpc::kExportRequest), peer_,
                    static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    }
    Finish(std::move(status));
  }

  const TransferContext& context_;
  grpc::CallbackServerContext* const call_;
  const std::string peer_;  // The caller, for the log of a failure.
  const Clock::time_point arrival_ = Clock::now();
  int64_t compute_ns_ = 0;
  std::string variant_ = kNoVariant;
  Principal caller_;
  grpc::ByteBuffer wire_request_;
  v1::ExportRequestRequest request_;
  std::shared_ptr<Session> session_;
  int64_t chunk_bytes_ = 0;
  RequestExport exported_;
  bool header_sent_ = false;
  size_t offset_ = 0;
  grpc::ByteBuffer wire_;
};

// ---- ImportRequest -----------------------------------------------------------------------------

// An ImportRequest's idle watch, shared with the timer callbacks that check it: the reactor is
// null once it stopped reading (its bytes are all here, or it ended). Every step of the reactor's
// reading runs under `mu`, so the timer never ends a call that a message is advancing.
struct ImportWatch {
  absl::Mutex mu;
  class ImportReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  absl::Time last_message ABSL_GUARDED_BY(mu) = absl::Now();
  // Not reading while the session's queue reserves the header's bytes: the wait is the server's,
  // not the client's silence, and the reservation's op still holds the reactor.
  bool paused ABSL_GUARDED_BY(mu) = false;
};

class ImportReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  ImportReactor(const TransferContext& context, grpc::CallbackServerContext* call,
                grpc::ByteBuffer* wire_response)
      : context_(context), call_(call), wire_response_(wire_response),
        watch_(std::make_shared<ImportWatch>()) {
    if (grpc::Status draining = context_.draining(); !draining.ok()) {
      Done(std::move(draining));
      return;
    }
    absl::StatusOr<Principal> caller = context_.authenticate(*call);
    if (!caller.ok()) {
      Done(ToGrpc(caller.status()));
      return;
    }
    // Refused before a byte is read when the backend cannot import.
    if (context_.capabilities != nullptr) {
      if (absl::Status s = CheckOperation(*context_.capabilities, LayerOperation::kExportImport);
          !s.ok()) {
        Done(ToGrpc(s));
        return;
      }
    }
    caller_ = *std::move(caller);
    absl::MutexLock lock(&watch_->mu);
    if (context_.timer != nullptr && context_.import_idle_timeout > absl::ZeroDuration()) {
      watch_->reactor = this;
      ScheduleWatch(watch_, context_, absl::Now() + context_.import_idle_timeout);
    }
    StartRead(&wire_);
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&watch_->mu);
    watch_->last_message = absl::Now();
    if (done_) return;  // Ended by the idle watch while this read was pending.
    if (!ok) {
      // The client half-closed (all bytes sent) or the call broke.
      if (call_->IsCancelled()) {
        return Done(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled"));
      }
      if (session_ == nullptr) {
        return Done(ToGrpc(absl::InvalidArgumentError(
            "the stream ended before its header (the first ImportRequestRequest)")));
      }
      if (static_cast<int64_t>(exported_.kv.pages.size()) != expected_bytes_) {
        return Done(ToGrpc(absl::InvalidArgumentError(
            absl::StrCat("pages: received ", exported_.kv.pages.size(), " bytes, expected ",
                         expected_bytes_, " (held_pages * page_bytes)"))));
      }
      return Commit();
    }
    v1::ImportRequestRequest message;
    if (!ParseMessage(wire_, &message)) return Done(UnparseableMessage(message, wire_.Length()));
    wire_.Clear();
    if (session_ == nullptr) {
      if (!message.has_header()) {
        return Done(ToGrpc(absl::InvalidArgumentError(
            "the first ImportRequestRequest must carry the header, not page bytes")));
      }
      if (absl::Status s = TakeHeader(message.header()); !s.ok()) return Done(ToGrpc(s));
      // The next read waits for the layer's reservation of the pages' bytes.
      return Reserve();
    } else {
      if (!message.has_pages()) {
        return Done(ToGrpc(absl::InvalidArgumentError(
            "after the header, every ImportRequestRequest must carry page bytes")));
      }
      const std::string& data = message.pages().data();
      if (static_cast<int64_t>(exported_.kv.pages.size() + data.size()) > expected_bytes_) {
        return Done(ToGrpc(absl::InvalidArgumentError(
            absl::StrCat("pages: more than the ", expected_bytes_,
                         " bytes the header announced (held_pages * page_bytes)"))));
      }
      exported_.kv.pages.append(data);
    }
    StartRead(&wire_);
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&watch_->mu);
      watch_->reactor = nullptr;
    }
    ReleaseReservation();  // Whatever ended the call.
    delete this;
  }

 private:
  // Checks `watch` at `at`: ends its stream when no message came for the idle timeout, else
  // checks again when the timeout after its last message passes.
  static void ScheduleWatch(std::shared_ptr<ImportWatch> watch, const TransferContext& context,
                            absl::Time at) {
    context.timer->Schedule(at, [watch, &context] {
      absl::MutexLock lock(&watch->mu);
      if (watch->reactor == nullptr) return;
      if (watch->paused) {
        ScheduleWatch(watch, context, absl::Now() + context.import_idle_timeout);
        return;
      }
      const absl::Time due = watch->last_message + context.import_idle_timeout;
      if (absl::Now() < due) {
        ScheduleWatch(watch, context, due);
        return;
      }
      ImportReactor* reactor = watch->reactor;
      watch->reactor = nullptr;
      // A read is pending (every message's handling holds `mu`), so OnDone waits for it: the
      // reactor outlives this call.
      reactor->Done(
          grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                       absl::StrCat("ImportRequest: no message for ",
                                    absl::FormatDuration(context.import_idle_timeout),
                                    " (--import_idle_timeout); the import is abandoned and its ",
                                    reactor->expected_bytes_, " reserved KV pool bytes released")));
    });
  }

  // Checks the header against the target session (its bytes are reserved next, by Reserve).
  absl::Status TakeHeader(const v1::ImportRequestHeader& header) {
    if (absl::Status s = CheckId(header.session_id(), "header.session_id", kMaxSessionIdBytes);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckId(header.request_id(), "header.request_id", kMaxRequestIdBytes);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::shared_ptr<Session>> session =
        context_.registry->Find(header.session_id(), caller_);
    if (!session.ok()) return session.status();
    const v1::ExportedRequest& request = header.request();
    if (absl::Status s = CheckSameLayer(request, **session); !s.ok()) return s;
    const int64_t length = request.sequence_length();
    if (length < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.request.sequence_length = ", length, ", must be >= 1"));
    }
    if (length > (*session)->limits().max_sequence_length) {
      return absl::OutOfRangeError(absl::StrCat(
          "header.request.sequence_length = ", length, " passes session '", (*session)->id(),
          "''s max_sequence_length (", (*session)->limits().max_sequence_length, ")"));
    }
    if (absl::Status s = CheckHeldPages(request, **session); !s.ok()) return s;
    if ((*session)->HasRequest(header.request_id())) {
      return absl::AlreadyExistsError(
          absl::StrCat("header.request_id: request '", header.request_id(),
                       "' already exists in session '", (*session)->id(), "'"));
    }
    const int64_t bytes = request.held_pages() * request.page_bytes();
    session_ = *std::move(session);
    variant_ = session_->variant_label();
    request_id_ = header.request_id();
    expected_bytes_ = bytes;
    exported_.kv.num_tokens = length;
    exported_.kv.first_held_page = request.first_held_page();
    for (const v1::ExportedLayer& layer : request.layers()) {
      exported_.kv.layers.push_back(
          LayerExtent{layer.sequence_length(), layer.first_held_page(), layer.held_pages()});
    }
    exported_.kv.page_bytes = request.page_bytes();
    exported_.kv.pages.reserve(static_cast<size_t>(bytes));
    exported_.last_position = request.last_position();
    return absl::OkStatus();
  }

  // The header is taken: the layer reserves its pages' bytes on a new sequence, in its turn on
  // the session's queue (Session::ReserveImport), and owns them from then on; the pages are read
  // once it has. Refused, the call ends before a page is read.
  void Reserve() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_->mu) {
    watch_->paused = true;
    const bool queued = session_->scheduler().PostOp({request_id_}, [this] {
      absl::StatusOr<SequenceId> reserved = session_->ReserveImport(exported_.kv.num_tokens);
      absl::MutexLock lock(&watch_->mu);
      watch_->paused = false;
      watch_->last_message = absl::Now();
      if (!reserved.ok()) return Done(ToGrpc(reserved.status()));
      reserved_ = *reserved;
      StartRead(&wire_);
    });
    if (!queued) Done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  }

  // Every byte is here: create the request in its turn on the session's queue.
  void Commit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(watch_->mu) {
    watch_->reactor = nullptr;  // No longer reading: the idle watch is done with this call.
    const bool queued = session_->scheduler().PostOp({request_id_}, [this] {
      const Clock::time_point start = Clock::now();
      // The pages go into the reserved sequence and draw on its reservation; the session releases
      // it when the import fails.
      const SequenceId reserved = *std::exchange(reserved_, std::nullopt);
      absl::StatusOr<ImportOutcome> imported =
          session_->ImportRequest(request_id_, exported_, reserved);
      compute_ns_ =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
      if (!imported.ok()) return Done(ToGrpc(imported.status()));
      v1::ImportRequestResponse response;
      response.set_request_id(request_id_);
      response.set_sequence_length(imported->sequence_length);
      response.set_kv_bytes_added(imported->kv_bytes_added);
      v1::Timing* timing = response.mutable_timing();
      timing->set_compute_ns(compute_ns_);
      timing->set_queue_ns(
          std::chrono::duration_cast<std::chrono::nanoseconds>(start - arrival_).count());
      timing->set_total_ns(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - arrival_).count());
      SERVER_LOG(INFO, "request %s imported into session %s: %d tokens, %d page bytes", request_id_,
                 session_->id(), imported->sequence_length, expected_bytes_);
      exported_ = RequestExport();  // The layer holds its own copy now.
      Done(SerializeMessage(response, context_.max_message_bytes, wire_response_));
    });
    if (!queued) Done(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
  }

  // An import that ended before its pages went in: the reserved sequence, and with it the
  // bytes, go back, in their turn on the session's queue (the layer is called there only).
  void ReleaseReservation() {
    if (!reserved_.has_value()) return;
    const SequenceId reserved = *std::exchange(reserved_, std::nullopt);
    std::shared_ptr<Session> session = session_;
    // Not queued only once the server is shutting down: the session's layer goes with it.
    session->scheduler().PostOp({request_id_},
                                [session, reserved] { session->AbandonImport(reserved); });
  }

  void Done(grpc::Status status) {
    if (done_) return;
    done_ = true;
    Observe(*context_.metrics, Rpc::kImportRequest, variant_, status, arrival_, compute_ns_);
    if (!status.ok()) {
      LogFailedCall(RpcLabel(Rpc::kImportRequest), call_->peer(),
                    static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    }
    // A held reservation goes back before the call is answered, so a client that sees the
    // failure finds the bytes free (no change of state behind a failed call). The reactor lives
    // until Finish, which the op calls.
    if (reserved_.has_value()) {
      const SequenceId reserved = *std::exchange(reserved_, std::nullopt);
      std::shared_ptr<Session> session = session_;
      if (session->scheduler().PostOp({request_id_}, [this, session, reserved, status] {
            session->AbandonImport(reserved);
            Finish(status);
          })) {
        return;
      }
      // Not queued only once the server is shutting down: the session's layer goes with it.
    }
    Finish(std::move(status));
  }

  const TransferContext& context_;
  grpc::CallbackServerContext* const call_;
  grpc::ByteBuffer* const wire_response_;
  const Clock::time_point arrival_ = Clock::now();
  int64_t compute_ns_ = 0;
  Principal caller_;
  std::string variant_ = kNoVariant;
  grpc::ByteBuffer wire_;
  std::shared_ptr<Session> session_;  // Set by the header.
  std::string request_id_;
  int64_t expected_bytes_ = 0;
  // The layer's sequence whose reservation holds the pages' bytes while they arrive
  // (Session::ReserveImport), until the import fills it or the call ends.
  std::optional<SequenceId> reserved_;
  RequestExport exported_;      // The header's numbers, and the page bytes as they arrive.
  std::shared_ptr<ImportWatch> watch_;
  bool done_ = false;  // Done ran (under watch_->mu while reading; on the queue after).
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartExportRequest(
    const TransferContext& context, grpc::CallbackServerContext* call) {
  return new ExportReactor(context, call);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* StartImportRequest(const TransferContext& context,
                                                              grpc::CallbackServerContext* call,
                                                              grpc::ByteBuffer* response) {
  return new ImportReactor(context, call, response);
}

}  // namespace attnserve::server

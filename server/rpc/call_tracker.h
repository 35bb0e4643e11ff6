// The server's calls from their start to their end, so that a shutdown can wait for the calls in
// flight before it tells the clients to go away.
//
// Why the shutdown needs this (ShutdownTest.SigtermDrainsAnInFlightCall): gRPC's
// Server::Shutdown(deadline) sends GOAWAY at once and waits for the calls, but a call is over for
// gRPC when its answer is in the connection's socket, not when the client has read it; the last
// stream closing then closes the connection, and a socket closed with unread bytes in (the
// client's WINDOW_UPDATEs and pings) is reset, which drops the part of the answer the client had
// not received yet ("Connection reset by peer": reproduced by freezing the client at SIGTERM).
// Waiting for the calls first, then shutting down, puts gRPC's graceful GOAWAY and its ping
// behind every answer on each connection: the final GOAWAY (and the close) waits for the
// client's ping ack, which it sends only once it has read what came before.
//
// A call counts from the moment gRPC creates it until it is destroyed, after its reactor's OnDone
// (its answer handed to the transport), whatever its service (health and reflection too).
#ifndef ATTNSERVE_SERVER_RPC_CALL_TRACKER_H_
#define ATTNSERVE_SERVER_RPC_CALL_TRACKER_H_

#include <grpcpp/support/server_interceptor.h>

#include <cstdint>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attnserve::server {

class CallTracker {
 public:
  CallTracker() = default;
  CallTracker(const CallTracker&) = delete;
  CallTracker& operator=(const CallTracker&) = delete;

  // For grpc::ServerBuilder::experimental().SetInterceptorCreators: counts every call of the
  // server it is given to. The tracker must outlive that server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  // Calls in flight now.
  int64_t live() const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every call that started before this call has ended, or until `deadline`. True
  // when they all ended. Calls that start meanwhile are not waited for (the service refuses them
  // while the server stops, so they end at once).
  bool AwaitCallsStartedBefore(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Interceptor;
  class Factory;

  // Numbers a starting call; Ended takes its number back.
  uint64_t Started() ABSL_LOCKS_EXCLUDED(mu_);
  void Ended(uint64_t number) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  uint64_t next_number_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;
  // Calls numbered below `cut_` still live (the ones AwaitCallsStartedBefore waits for).
  uint64_t cut_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t live_before_cut_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RPC_CALL_TRACKER_H_

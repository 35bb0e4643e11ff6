// `attnctl move`: one request from the session on --server to a session on --to with the same
// fingerprint (ExportRequest piped into ImportRequest, client/request_mover.h).
#ifndef ATTNSERVE_CLIENT_ATTNCTL_MOVE_H_
#define ATTNSERVE_CLIENT_ATTNCTL_MOVE_H_

#include "client/attnctl_client.h"
#include "client/channel_security.h"

namespace attnserve {

// Reads --session, --request, --to, --to_session, --new_request and --release_source; prints what
// moved (JSON with --json). Exit codes as attnctl's.
int RunMove(const Client& source, const ChannelSecurity& security);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNCTL_MOVE_H_

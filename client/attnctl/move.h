// `attnctl move`: one request from the session on --server to a session on --to with the same
// fingerprint (ExportRequest piped into ImportRequest, client/common/request_mover.h).
#ifndef ATTNSERVE_CLIENT_ATTNCTL_MOVE_H_
#define ATTNSERVE_CLIENT_ATTNCTL_MOVE_H_

#include "client/common/client.h"
#include "client/common/channel_security.h"

namespace attnserve {

// Reads --session, --request, --to, --to_session, --new_request and --release_source; prints what
// moved (JSON with --json). Exit codes as attnctl's.
int RunMove(const Client& source, const ChannelSecurity& security);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNCTL_MOVE_H_

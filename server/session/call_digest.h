// The digest of one Forward or Decode call's inputs, kept with a call_id's retained output.
//
// A call_id names one call: a retry resends the same items. Recognising a retry by its call_id
// alone answered a new call that reused the id (a client bug, or two clients sharing a counter)
// with the earlier call's output and OK. The digest lets the session tell a retry (same inputs:
// answered from what the call left) from a reuse (other inputs: INVALID_ARGUMENT naming call_id).
#ifndef ATTNSERVE_SERVER_SESSION_CALL_DIGEST_H_
#define ATTNSERVE_SERVER_SESSION_CALL_DIGEST_H_

#include <string>
#include <vector>

#include "server/session/session.h"

namespace attnserve::server {

// SHA-256 over the kind of call (decode or forward) and, in order, every item's request id, the
// hidden rows' dtype, shape and bytes, and the positions as given (empty = continue from the
// length). Equal for a faithful retry; different when any of these differ.
std::string CallInputDigest(const std::vector<StepInput>& inputs, bool decode);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_CALL_DIGEST_H_

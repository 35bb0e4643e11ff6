#include "server/session/call_digest.h"

#include <cstdint>

#include "server/security/digest_writer.h"

namespace attnserve::server {

std::string CallInputDigest(const std::vector<StepInput>& inputs, bool decode) {
  DigestWriter digest;
  digest.AddInt(decode ? 1 : 0);
  digest.AddInt(static_cast<int64_t>(inputs.size()));
  for (const StepInput& in : inputs) {
    digest.AddString(in.request_id);
    digest.AddTensor(in.hidden);
    digest.AddInt(static_cast<int64_t>(in.positions.size()));
    for (int64_t position : in.positions) digest.AddInt(position);
  }
  return digest.Finish();
}

}  // namespace attnserve::server

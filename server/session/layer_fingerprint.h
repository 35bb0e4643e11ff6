// What makes two sessions interchangeable for a moved request: a SHA-256 over the layer spec, how
// its KV pages are stored (format and page size) and its weights as loaded. Computed once at
// Configure (ConfigureResponse.fingerprint); ImportRequest refuses a request whose source session's
// fingerprint differs, since its pages would be read by other weights or in another layout.
#ifndef ATTNSERVE_SERVER_SESSION_LAYER_FINGERPRINT_H_
#define ATTNSERVE_SERVER_SESSION_LAYER_FINGERPRINT_H_

#include <string>

#include "kernels/kv/storage_format.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/model/layer_weights.h"

namespace attnserve::server {

// 32 raw bytes. Covers the spec as serialized by the API, the storage format, the page size, and
// each weight's name, dtype, shape and bytes (in name order). Weights equal in value but sent in
// another dtype fingerprint differently: the check errs on the side of refusing.
std::string LayerFingerprint(const LayerSpec& spec, const KvStorageFormat& storage, int page_size,
                             const LayerWeights& weights);

// Lowercase hex of `bytes`, for logs and attnctl.
std::string HexBytes(const std::string& bytes);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_LAYER_FINGERPRINT_H_

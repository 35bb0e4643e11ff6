// `attnctl demo`: the client-side demo of README command (1). For each of the four demo variants
// (client/common/demo_variants.h) it configures a session on the server, prefills a batch of
// requests, decodes a number of steps for all of them, reads the session's KV use, releases the
// session and prints one table row: parameters, KV bytes per token, KV MiB in use, prefill and
// decode times as the client measured them and as the server reports its compute time.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_DEMO_H_
#define ATTNSERVE_CLIENT_ATTNCTL_DEMO_H_

#include <cstdint>

#include "client/common/client.h"
#include "kernels/core/tensor.h"
#include "kernels/kv/storage_format.h"

namespace attnserve {

struct DemoOptions {
  int d_model = 512;
  int num_heads = 8;
  int window = 0;    // Sliding window of every variant; 0 = full attention.
  int batch = 4;     // Requests per session.
  int tokens = 128;  // Prompt tokens per request.
  int steps = 16;    // Decode steps after the prefill.
  DType kv_dtype = DType::kF32;
  KvQuantization kv_quantization = KvQuantization::kNone;  // 8-bit KV pages (--kv_quant).
  uint64_t seed = 1;  // Weights and inputs.
};

// Returns attnctl's exit code.
int RunDemo(const Client& client, const DemoOptions& options);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNCTL_DEMO_H_

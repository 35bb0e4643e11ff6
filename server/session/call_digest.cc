#include "server/session/call_digest.h"

#include <openssl/evp.h>

#include <cstdint>
#include <memory>

namespace attnserve::server {

namespace {

// Every field at a fixed width or behind its length, so no two inputs concatenate alike.
void HashInt(EVP_MD_CTX* ctx, int64_t value) {
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(uint64_t(value) >> (8 * i));
  EVP_DigestUpdate(ctx, bytes, sizeof(bytes));
}

void HashBytes(EVP_MD_CTX* ctx, const void* data, size_t size) {
  HashInt(ctx, static_cast<int64_t>(size));
  EVP_DigestUpdate(ctx, data, size);
}

}  // namespace

std::string CallInputDigest(const std::vector<StepInput>& inputs, bool decode) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  HashInt(ctx.get(), decode ? 1 : 0);
  HashInt(ctx.get(), static_cast<int64_t>(inputs.size()));
  for (const StepInput& in : inputs) {
    HashBytes(ctx.get(), in.request_id.data(), in.request_id.size());
    HashInt(ctx.get(), static_cast<int64_t>(in.hidden.dtype()));
    HashInt(ctx.get(), static_cast<int64_t>(in.hidden.shape().size()));
    for (int64_t dim : in.hidden.shape()) HashInt(ctx.get(), dim);
    HashBytes(ctx.get(), in.hidden.data(), in.hidden.num_bytes());
    HashInt(ctx.get(), static_cast<int64_t>(in.positions.size()));
    for (int64_t position : in.positions) HashInt(ctx.get(), position);
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &size);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

}  // namespace attnserve::server

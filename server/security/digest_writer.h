// A SHA-256 over a sequence of typed fields, for digests that must tell inputs apart exactly
// (session fingerprints, call_id retries). Every field is written at a fixed width or behind its
// length, so no two different field sequences feed the hash the same bytes.
#ifndef ATTNSERVE_SERVER_SECURITY_DIGEST_WRITER_H_
#define ATTNSERVE_SERVER_SECURITY_DIGEST_WRITER_H_

#include <openssl/evp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "kernels/core/tensor.h"

namespace attnserve::server {

class DigestWriter {
 public:
  DigestWriter();

  // An integer as 8 little-endian bytes.
  void AddInt(int64_t value);
  // `size` first, then the bytes.
  void AddBytes(const void* data, size_t size);
  void AddString(absl::string_view text) { AddBytes(text.data(), text.size()); }
  // dtype, rank, each dimension, then the data.
  void AddTensor(const Tensor& tensor);

  // The 32-byte digest; the writer is spent after this.
  std::string Finish();

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SECURITY_DIGEST_WRITER_H_

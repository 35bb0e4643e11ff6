#include "server/security/digest_writer.h"

namespace attnserve::server {

DigestWriter::DigestWriter() : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
  EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
}

void DigestWriter::AddInt(int64_t value) {
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(uint64_t(value) >> (8 * i));
  EVP_DigestUpdate(ctx_.get(), bytes, sizeof(bytes));
}

void DigestWriter::AddBytes(const void* data, size_t size) {
  AddInt(static_cast<int64_t>(size));
  EVP_DigestUpdate(ctx_.get(), data, size);
}

void DigestWriter::AddTensor(const Tensor& tensor) {
  AddInt(static_cast<int64_t>(tensor.dtype()));
  AddInt(static_cast<int64_t>(tensor.shape().size()));
  for (int64_t dim : tensor.shape()) AddInt(dim);
  AddBytes(tensor.data(), tensor.num_bytes());
}

std::string DigestWriter::Finish() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx_.get(), digest, &size);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

}  // namespace attnserve::server

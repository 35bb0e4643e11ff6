#include "server/session/layer_fingerprint.h"

#include <openssl/evp.h>

#include <cstdint>
#include <memory>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "kernels/kv/quantization.h"
#include "proto/codec/spec_codec.h"

namespace attnserve::server {

namespace {

// The spec's API encoding, deterministic (fields in number order, no maps to reorder).
std::string SerializedSpec(const LayerSpec& spec) {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  LayerSpecToProto(spec).SerializeToCodedStream(&coded);
  coded.Trim();
  return bytes;
}

// Feeds an integer as 8 little-endian bytes, so every field has a fixed width and no two inputs
// concatenate to the same stream.
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

std::string LayerFingerprint(const LayerSpec& spec, const KvStorageFormat& storage, int page_size,
                             const LayerWeights& weights) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  const std::string spec_bytes = SerializedSpec(spec);
  HashBytes(ctx.get(), spec_bytes.data(), spec_bytes.size());
  // "f32", "bf16", "fp8_e4m3", "int8": ExportedRequest.kv_format (fp8 and int8 pages share their
  // element type and scale scheme; their codes differ).
  const std::string format = KvStorageFormatName(storage);
  HashBytes(ctx.get(), format.data(), format.size());
  HashInt(ctx.get(), page_size);
  HashInt(ctx.get(), static_cast<int64_t>(weights.size()));
  for (const auto& [name, tensor] : weights) {  // std::map: in name order.
    HashBytes(ctx.get(), name.data(), name.size());
    HashInt(ctx.get(), static_cast<int64_t>(tensor.dtype()));
    HashInt(ctx.get(), static_cast<int64_t>(tensor.shape().size()));
    for (int64_t dim : tensor.shape()) HashInt(ctx.get(), dim);
    HashBytes(ctx.get(), tensor.data(), tensor.num_bytes());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &size);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

std::string HexBytes(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    hex.push_back(kDigits[c >> 4]);
    hex.push_back(kDigits[c & 15]);
  }
  return hex;
}

}  // namespace attnserve::server

#include "server/session/layer_fingerprint.h"

#include <cstdint>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "kernels/kv/quantization.h"
#include "proto/codec/spec_codec.h"
#include "server/security/digest_writer.h"

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

}  // namespace

std::string LayerFingerprint(const LayerSpec& spec, const KvStorageFormat& storage, int page_size,
                             const LayerWeights& weights) {
  DigestWriter digest;
  digest.AddString(SerializedSpec(spec));
  // "f32", "bf16", "fp8_e4m3", "int8": ExportedRequest.kv_format (fp8 and int8 pages share their
  // element type and scale scheme; their codes differ).
  digest.AddString(KvStorageFormatName(storage));
  digest.AddInt(page_size);
  digest.AddInt(static_cast<int64_t>(weights.size()));
  for (const auto& [name, tensor] : weights) {  // std::map: in name order.
    digest.AddString(name);
    digest.AddTensor(tensor);
  }
  return digest.Finish();
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

#include "server/rpc/wire_call.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve::server {

bool ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  message->Clear();
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  if (slices.size() == 1) {
    return message->ParseFromArray(slices[0].begin(), static_cast<int>(slices[0].size()));
  }
  // Rare (large messages arrive in several slices): join them once.
  std::string joined;
  joined.reserve(buffer.Length());
  for (const grpc::Slice& slice : slices) {
    joined.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return message->ParseFromString(joined);
}

grpc::Status UnparseableMessage(const google::protobuf::Message& message, size_t num_bytes) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("request is not a valid ", message.GetTypeName(), " (",
                                   num_bytes, " bytes could not be parsed)"));
}

grpc::Status SerializeMessage(const google::protobuf::Message& message, int64_t max_bytes,
                              grpc::ByteBuffer* buffer) {
  const size_t size = message.ByteSizeLong();
  if (static_cast<int64_t>(size) > max_bytes) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("the response is ", size,
                                     " bytes, over the server's max_message_bytes = ", max_bytes));
  }
  grpc::Slice slice(size);
  message.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(slice.begin()));
  grpc::ByteBuffer serialized(&slice, 1);
  buffer->Swap(&serialized);
  return grpc::Status::OK;
}

}  // namespace attnserve::server

// The reply bytes of a stream, reused from message to message.
//
// A DecodeStream answers one message per layer per step with a reply of the same size each time
// (the outputs of the step's requests). SerializeMessage allocates each reply's bytes afresh;
// a ReplyBuffer serializes into one block that it keeps, handing gRPC a slice over it. gRPC may
// hold a slice after OnWriteDone (until its transport has written it), so the block is
// reference-counted: the next reply reuses it only once gRPC has dropped its slice, and otherwise
// takes a new block (the old one is freed by whichever lets go last).
#ifndef ATTNSERVE_SERVER_RPC_REPLY_BUFFER_H_
#define ATTNSERVE_SERVER_RPC_REPLY_BUFFER_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstdint>

#include "google/protobuf/message.h"

namespace attnserve::server {

class ReplyBuffer {
 public:
  ReplyBuffer() = default;
  ReplyBuffer(const ReplyBuffer&) = delete;
  ReplyBuffer& operator=(const ReplyBuffer&) = delete;
  ~ReplyBuffer();

  // As SerializeMessage (server/rpc/wire_call.h): `message` into `buffer`, RESOURCE_EXHAUSTED
  // (and `buffer` untouched) when it is larger than `max_bytes` or its bytes cannot be allocated.
  // `buffer` refers to this object's block until gRPC lets go of it.
  grpc::Status Serialize(const google::protobuf::Message& message, int64_t max_bytes,
                         grpc::ByteBuffer* buffer);

  // How many replies took a new block (the first one, a larger one, or one while gRPC still held
  // the last): for tests and benchmarks.
  int64_t blocks_made() const { return blocks_made_; }

 private:
  struct Block;
  static void Unref(void* block);

  Block* block_ = nullptr;  // Owned jointly with gRPC's slice over it, if any.
  int64_t blocks_made_ = 0;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RPC_REPLY_BUFFER_H_

#include "server/rpc/reply_buffer.h"

#include <atomic>
#include <cstddef>
#include <memory>
#include <new>

#include "server/rpc/wire_call.h"

namespace attnserve::server {

struct ReplyBuffer::Block {
  // 1 for the ReplyBuffer that made it (until it moves on or is destroyed), 1 while gRPC holds
  // the slice over it.
  std::atomic<int> refs{1};
  size_t capacity = 0;
  std::unique_ptr<uint8_t[]> data;
};

void ReplyBuffer::Unref(void* block) {
  Block* b = static_cast<Block*>(block);
  if (b->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete b;
}

ReplyBuffer::~ReplyBuffer() {
  if (block_ != nullptr) Unref(block_);
}

grpc::Status ReplyBuffer::Serialize(const google::protobuf::Message& message, int64_t max_bytes,
                                    grpc::ByteBuffer* buffer) {
  const size_t size = message.ByteSizeLong();
  if (grpc::Status fits = CheckResponseSize(size, max_bytes); !fits.ok()) return fits;
  // Reusable when gRPC has let go of its slice (only this object's reference is left) and the
  // reply fits; the acquire pairs with Unref's release, so gRPC's reads are over.
  const bool reusable = block_ != nullptr &&
                        block_->refs.load(std::memory_order_acquire) == 1 &&
                        block_->capacity >= size;
  if (!reusable) {
    // Allocated here rather than by gRPC (grpc::Slice(size) aborts the process when malloc
    // fails): a reply the process cannot hold fails its call alone.
    auto fresh = std::unique_ptr<Block>(new (std::nothrow) Block);
    if (fresh != nullptr) {
      fresh->data.reset(new (std::nothrow) uint8_t[size == 0 ? 1 : size]);
      fresh->capacity = size == 0 ? 1 : size;
    }
    if (fresh == nullptr || fresh->data == nullptr) return ResponseNotAllocated(size);
    if (block_ != nullptr) Unref(block_);
    block_ = fresh.release();
    ++blocks_made_;
  }
  message.SerializeWithCachedSizesToArray(block_->data.get());
  block_->refs.fetch_add(1, std::memory_order_relaxed);  // gRPC's, dropped by Unref.
  grpc::Slice slice(block_->data.get(), size, &ReplyBuffer::Unref, block_);
  grpc::ByteBuffer serialized(&slice, 1);
  buffer->Swap(&serialized);
  return grpc::Status::OK;
}

}  // namespace attnserve::server

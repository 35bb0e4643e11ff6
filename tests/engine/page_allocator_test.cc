// PageAllocator: all-or-nothing allocation, reuse of freed ids, exact accounting, and a cost that
// follows use rather than capacity (a layer may be sized for a whole device pool of tiny pages).
#include "kernels/kv/sequence_table.h"

#include <set>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(PageAllocatorTest, AllOrNothingAndReuse) {
  PageAllocator allocator(5);
  absl::StatusOr<std::vector<int32_t>> a = allocator.Allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2}));
  absl::StatusOr<std::vector<int32_t>> refused = allocator.Allocate(3);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(allocator.used(), 3);
  EXPECT_EQ(allocator.free(), 2);

  allocator.Free({(*a)[1]});
  absl::StatusOr<std::vector<int32_t>> b = allocator.Allocate(3);
  ASSERT_TRUE(b.ok());
  const std::set<int32_t> ids(b->begin(), b->end());
  EXPECT_EQ(ids, (std::set<int32_t>{1, 3, 4})) << "the freed id first, then fresh ones";
  EXPECT_EQ(allocator.free(), 0);
  allocator.Free(*b);
  allocator.Free({(*a)[0], (*a)[2]});
  EXPECT_EQ(allocator.used(), 0);
}

TEST(PageAllocatorTest, HugeCapacityCostsNothingUpFront) {
  // 2^31 - 1 ids: a free list built eagerly would take 8 GiB.
  PageAllocator allocator((int64_t{1} << 31) - 1);
  absl::StatusOr<std::vector<int32_t>> pages = allocator.Allocate(4);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(allocator.used(), 4);
  EXPECT_EQ(allocator.free(), (int64_t{1} << 31) - 5);
}

}  // namespace
}  // namespace attnserve

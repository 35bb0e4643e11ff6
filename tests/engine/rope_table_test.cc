// The shared RoPE table (kernels/cpu/rope_table.h): every position's cos/sin equal, bit for bit,
// to RotaryPositions::FillTable (what each layer computed before), across block boundaries and
// past the kept range, also when threads look up at once; layers with equal parameters share one
// table and layers with other ones do not.
#include "kernels/cpu/rope_table.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

RotaryPositions MakeRope(std::vector<double>& inv_freq, int rotary_dim, double base) {
  inv_freq.resize(rotary_dim / 2);
  for (int i = 0; i < rotary_dim / 2; ++i) {
    inv_freq[i] = 1.0 / std::pow(base, 2.0 * i / rotary_dim);
  }
  RotaryPositions rope;
  rope.inv_freq = inv_freq.data();
  rope.rotary_dim = rotary_dim;
  rope.attention_factor = 1.25f;  // Not 1, so that the factor's multiply is checked too.
  return rope;
}

void ExpectSameAsFillTable(const RotaryPositions& rope, RopeTable& table, int64_t position) {
  std::vector<float> want(rope.rotary_dim), got(rope.rotary_dim, -7.0f);
  rope.FillTable(position, want.data(), want.data() + rope.pairs());
  table.Lookup(position, got.data());
  for (int i = 0; i < rope.rotary_dim; ++i) {
    // Exact: the table holds FillTable's own floats.
    EXPECT_EQ(got[i], want[i]) << "position " << position << " element " << i;
  }
}

TEST(RopeTableTest, EveryPositionMatchesFillTableExactly) {
  std::vector<double> inv_freq;
  const RotaryPositions rope = MakeRope(inv_freq, 64, 10000.0);
  const std::shared_ptr<RopeTable> table = RopeTable::For(rope);
  // Out of order, across block boundaries, and past the kept range.
  for (int64_t position :
       {int64_t{700}, int64_t{0}, int64_t{1}, RopeTable::kBlock - 1, RopeTable::kBlock,
        3 * RopeTable::kBlock + 5, RopeTable::kMaxKeptPosition - 1, RopeTable::kMaxKeptPosition,
        RopeTable::kMaxKeptPosition + 12345}) {
    ExpectSameAsFillTable(rope, *table, position);
  }
}

TEST(RopeTableTest, ConcurrentLookupsMatch) {
  std::vector<double> inv_freq;
  const RotaryPositions rope = MakeRope(inv_freq, 32, 500000.0);
  const std::shared_ptr<RopeTable> table = RopeTable::For(rope);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t position = t; position < 4 * RopeTable::kBlock; position += 3) {
        ExpectSameAsFillTable(rope, *table, position);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

TEST(RopeTableTest, EqualParametersShareOneTable) {
  std::vector<double> a_freq, b_freq, c_freq;
  const RotaryPositions a = MakeRope(a_freq, 64, 10000.0);
  const RotaryPositions b = MakeRope(b_freq, 64, 10000.0);  // Equal values, another vector.
  const RotaryPositions c = MakeRope(c_freq, 64, 20000.0);
  RotaryPositions d = a;
  d.attention_factor = 1.0f;
  const std::shared_ptr<RopeTable> ta = RopeTable::For(a);
  EXPECT_EQ(RopeTable::For(b), ta);
  EXPECT_NE(RopeTable::For(c), ta);
  EXPECT_NE(RopeTable::For(d), ta);
  ExpectSameAsFillTable(d, *RopeTable::For(d), 300);
}

}  // namespace
}  // namespace attnserve

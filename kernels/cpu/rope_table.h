// RoPE's cos/sin by position, computed once per model instead of once per layer and step.
//
// Every layer of a model rotates a step's rows with the same tables (same inverse frequencies,
// same positions), and a table is rotary_dim / 2 double sin and cos calls: at SmolLM2's shape
// (32 pairs) eight decode rows cost about 18 µs of one thread per layer, recomputed by all 30
// layers. A RopeTable holds the tables of every position seen so far (in blocks of kBlock
// positions, 256 bytes a position at 32 pairs), shared by the live layers with equal RoPE
// parameters; the values are RotaryPositions::FillTable's, so a rotation is the same bit for bit.
#ifndef ATTNSERVE_KERNELS_CPU_ROPE_TABLE_H_
#define ATTNSERVE_KERNELS_CPU_ROPE_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "kernels/spec/attention_variation.h"

namespace attnserve {

class RopeTable {
 public:
  // Positions per block, computed together on first use.
  static constexpr int64_t kBlock = 256;
  // Positions at and past this are computed on each call, not kept: a table holds at most
  // 2^15 x rotary_dim floats (8 MiB at SmolLM2's 32 pairs, 16 MiB at 64), outside the KV budget,
  // and only for the positions a model has reached.
  static constexpr int64_t kMaxKeptPosition = int64_t{1} << 15;

  // The table for `rope`'s parameters (rope.active()), shared with every other holder of equal
  // ones (inverse frequencies compared by value); lives while a holder does.
  static std::shared_ptr<RopeTable> For(const RotaryPositions& rope);

  // table[0, pairs): cos of each pair at `position` (>= 0); table[pairs, 2 pairs): sin.
  // Thread-safe.
  void Lookup(int64_t position, float* table);

  // For For(); use For().
  RopeTable(const RotaryPositions& rope, std::vector<double> inv_freq);

 private:
  bool SameParameters(const RotaryPositions& rope) const;

  std::vector<double> inv_freq_;  // A copy: the layer that made this table may go first.
  RotaryPositions rope_;          // rope_.inv_freq points into inv_freq_.
  absl::Mutex mu_;
  // Block b: positions [b kBlock, (b + 1) kBlock), each rotary_dim floats (cos then sin).
  std::vector<std::unique_ptr<float[]>> blocks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_ROPE_TABLE_H_

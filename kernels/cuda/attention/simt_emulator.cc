#include "kernels/cuda/attention/simt_emulator.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <barrier>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace attnserve::cuda::simt::emulator {

namespace {

constexpr int kWarpSize = 32;

// What the lanes of one warp exchange at a shuffle or an mma.
struct WarpSlots {
  WarpSlots() : barrier(kWarpSize) {}
  std::barrier<> barrier;
  float shuffle[kWarpSize];
  uint32_t a[kWarpSize][4];
  uint32_t b[kWarpSize][2];
};

struct Block {
  explicit Block(int threads) : barrier(threads), warps(threads / kWarpSize) {}
  std::barrier<> barrier;
  std::vector<WarpSlots> warps;
};

struct ThreadState {
  Block* block = nullptr;
  int thread = 0;
};
thread_local ThreadState current;

WarpSlots& MyWarp() { return current.block->warps[current.thread / kWarpSize]; }
int MyLane() { return current.thread % kWarpSize; }

// One 16-bit element (0 = low half) of a register, as a double.
double Element(uint32_t reg, int half, bool bf16) {
  const uint16_t bits = static_cast<uint16_t>(half == 0 ? reg & 0xFFFFu : reg >> 16);
  if (bf16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return static_cast<double>(__bfloat162float(__nv_bfloat16(raw)));
  }
  __half_raw raw;
  raw.x = bits;
  return static_cast<double>(__half2float(__half(raw)));
}

// The PTX ISA's fragment layout of mma.m16n8k16 with .f16/.bf16 inputs, stated as "which lane,
// register and half holds element (row, col)". groupID = lane >> 2, threadID_in_group = lane % 4.
//   A (16x16, row): a0..a7 in 4 registers; row = groupID (+8 for a2,a3,a6,a7),
//                   col = threadID_in_group * 2 + (i & 1) (+8 for a4..a7).
//   B (16x8, col):  b0..b3 in 2 registers; row = threadID_in_group * 2 + (i & 1) (+8 for b2,b3),
//                   col = groupID.
double AElement(const WarpSlots& w, int row, int col, bool bf16) {
  const int lane = (row % 8) * 4 + (col % 8) / 2;
  const int reg = (row >= 8 ? 1 : 0) + (col >= 8 ? 2 : 0);
  return Element(w.a[lane][reg], col % 2, bf16);
}
double BElement(const WarpSlots& w, int row, int col, bool bf16) {
  const int lane = col * 4 + (row % 8) / 2;
  const int reg = row >= 8 ? 1 : 0;
  return Element(w.b[lane][reg], row % 2, bf16);
}

}  // namespace

void RunBlock(int threads, const std::function<void()>& block) {
  Block shared(threads);
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&shared, &block, t] {
      current.block = &shared;
      current.thread = t;
      block();
      current.block = nullptr;
    });
  }
  for (std::thread& worker : workers) worker.join();
}

int ThreadIndex() { return current.thread; }

void SyncBlock() { current.block->barrier.arrive_and_wait(); }

float ShflXor(float value, int lane_mask) {
  WarpSlots& w = MyWarp();
  w.shuffle[MyLane()] = value;
  w.barrier.arrive_and_wait();
  const float result = w.shuffle[MyLane() ^ lane_mask];
  w.barrier.arrive_and_wait();  // Nobody overwrites a slot before every lane has read.
  return result;
}

void Mma16816(bool bf16, float c[4], const uint32_t a[4], const uint32_t b[2]) {
  WarpSlots& w = MyWarp();
  const int lane = MyLane();
  std::memcpy(w.a[lane], a, sizeof(w.a[lane]));
  std::memcpy(w.b[lane], b, sizeof(w.b[lane]));
  w.barrier.arrive_and_wait();
  // C/D (16x8): c0,c1 at row groupID, c2,c3 at row groupID + 8; col = threadID_in_group*2 + (i&1).
  for (int i = 0; i < 4; ++i) {
    const int row = lane / 4 + (i >= 2 ? 8 : 0);
    const int col = (lane % 4) * 2 + (i & 1);
    double sum = c[i];
    for (int k = 0; k < 16; ++k) sum += AElement(w, row, k, bf16) * BElement(w, k, col, bf16);
    c[i] = static_cast<float>(sum);
  }
  w.barrier.arrive_and_wait();
}

}  // namespace attnserve::cuda::simt::emulator

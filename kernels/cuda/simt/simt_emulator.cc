#include "kernels/cuda/simt/simt_emulator.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cuda/simt/fiber_context.h"

// Each emulated CUDA thread is a fiber (fiber_context.h) of the calling OS thread, so a block of 128
// threads costs 128 context switches per barrier rather than 128 OS threads contending for two
// cores. Fibers run round-robin; one that reaches a barrier yields until every live thread of its
// scope (warp or block) has arrived. As on a GPU, a thread that has exited no longer counts.
// A pass over all fibers in which no barrier completes and no fiber finishes is a deadlock (some
// thread waits at a barrier the others never reach): reported and aborted, not hung.

namespace attnserve::cuda::simt::emulator {

namespace {

constexpr int kWarpSize = 32;
constexpr size_t kStackBytes = size_t{256} << 10;

struct Barrier {
  int arrived = 0;
  int live = 0;  // Threads of the scope that have not exited.
  uint64_t generation = 0;
};

// What the lanes of one warp exchange at a shuffle or an mma.
struct WarpSlots {
  Barrier barrier;
  float shuffle[kWarpSize];
  uint32_t a[kWarpSize][4];
  uint32_t b[kWarpSize][2];
};

struct Fiber {
  FiberContext context;
  bool done = false;
};

struct Block {
  const std::function<void()>* body = nullptr;
  int threads = 0;
  int current = 0;  // The running fiber = threadIdx.x.
  uint64_t progress = 0;
  FiberContext scheduler;
  std::vector<Fiber> fibers;
  Barrier barrier;
  std::vector<WarpSlots> warps;
};

thread_local Block* current_block = nullptr;
// Fiber stacks, kept across blocks.
thread_local std::vector<std::unique_ptr<char[]>> stacks;

void Yield() {
  Block& block = *current_block;
  SwitchFiber(block.fibers[block.current].context, block.scheduler);
}

void Arrive(Barrier& barrier) {
  const uint64_t generation = barrier.generation;
  if (++barrier.arrived == barrier.live) {
    barrier.arrived = 0;
    ++barrier.generation;
    ++current_block->progress;
    return;
  }
  while (barrier.generation == generation) Yield();
}

// A thread exited: the barriers stop waiting for it (and complete if it was the last one out).
void Leave(Barrier& barrier) {
  if (--barrier.live > 0 && barrier.arrived == barrier.live) {
    barrier.arrived = 0;
    ++barrier.generation;
  }
}

void FiberMain() {
  Block& block = *current_block;
  const int thread = block.current;
  (*block.body)();
  block.fibers[thread].done = true;
  ++block.progress;
  Leave(block.barrier);
  Leave(block.warps[thread / kWarpSize].barrier);
  // The last switch out: the scheduler never resumes a finished fiber, and a fiber's entry has no
  // frame to return to.
  SwitchFiber(block.fibers[thread].context, block.scheduler);
  std::abort();
}

WarpSlots& MyWarp() { return current_block->warps[current_block->current / kWarpSize]; }
int MyLane() { return current_block->current % kWarpSize; }

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

// Makes fiber t start at FiberMain on its stack at the next Resume.
void InitFiber(Block& block, int t) {
  MakeFiber(block.fibers[t].context, stacks[t].get(), kStackBytes, FiberMain);
}

// Runs fiber t until it yields or finishes.
void Resume(Block& block, int t) {
  block.current = t;
  SwitchFiber(block.scheduler, block.fibers[t].context);
}

}  // namespace

void RunBlock(int threads, const std::function<void()>& body) {
  if (threads <= 0 || threads % kWarpSize != 0 || current_block != nullptr) {
    std::fprintf(stderr, "simt emulator: bad block (%d threads, nested=%d)\n", threads,
                 current_block != nullptr);
    std::abort();
  }
  Block block;
  block.body = &body;
  block.threads = threads;
  block.fibers.resize(threads);
  block.barrier.live = threads;
  block.warps.resize(threads / kWarpSize);
  for (WarpSlots& warp : block.warps) warp.barrier.live = kWarpSize;
  while (static_cast<int>(stacks.size()) < threads) {
    stacks.push_back(std::make_unique<char[]>(kStackBytes));
  }
  for (int t = 0; t < threads; ++t) InitFiber(block, t);
  current_block = &block;
  int remaining = threads;
  while (remaining > 0) {
    const uint64_t progress_before = block.progress;
    for (int t = 0; t < threads; ++t) {
      if (block.fibers[t].done) continue;
      Resume(block, t);
      if (block.fibers[t].done) --remaining;
    }
    if (remaining > 0 && block.progress == progress_before) {
      std::fprintf(stderr,
                   "simt emulator: deadlock: %d of %d threads wait at a barrier that the others "
                   "never reach\n",
                   remaining, threads);
      std::abort();
    }
  }
  current_block = nullptr;
}

int ThreadIndex() { return current_block->current; }

void SyncBlock() { Arrive(current_block->barrier); }

float ShflXor(float value, int lane_mask) {
  WarpSlots& w = MyWarp();
  const int lane = MyLane();
  w.shuffle[lane] = value;
  Arrive(w.barrier);
  const float result = w.shuffle[lane ^ lane_mask];
  Arrive(w.barrier);  // Nobody overwrites a slot before every lane has read.
  return result;
}

void Mma16816(bool bf16, float c[4], const uint32_t a[4], const uint32_t b[2]) {
  WarpSlots& w = MyWarp();
  const int lane = MyLane();
  std::memcpy(w.a[lane], a, sizeof(w.a[lane]));
  std::memcpy(w.b[lane], b, sizeof(w.b[lane]));
  Arrive(w.barrier);
  // C/D (16x8): c0,c1 at row groupID, c2,c3 at row groupID + 8; col = threadID_in_group*2 + (i&1).
  for (int i = 0; i < 4; ++i) {
    const int row = lane / 4 + (i >= 2 ? 8 : 0);
    const int col = (lane % 4) * 2 + (i & 1);
    double sum = c[i];
    for (int k = 0; k < 16; ++k) sum += AElement(w, row, k, bf16) * BElement(w, k, col, bf16);
    c[i] = static_cast<float>(sum);
  }
  Arrive(w.barrier);
}

}  // namespace attnserve::cuda::simt::emulator

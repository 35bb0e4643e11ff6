// The kernel launchers of kernels/cuda/attention/params.h for the emulated device: each "launch"
// runs every block of the grid, one after another, on the CPU block emulator, executing the
// kernels' own block functions (the same source nvcc compiles). Replaces the .cu launchers and,
// like them, ends with cudaGetLastError(), which returns (and clears) the thread's last error.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/core/tensor.h"
#include "kernels/cuda/attention/combine.cuh"
#include "kernels/cuda/attention/kv_append.cuh"
#include "kernels/cuda/attention/paged_attention.cuh"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/prefill_mma.cuh"
#include "kernels/cuda/attention/rope_append.cuh"
#include "kernels/cuda/simt/simt_emulator.h"

namespace attnserve::cuda {

namespace {

using simt::emulator::RunBlock;

// Shared memory starts as garbage on a GPU; here every block's starts as NaN bytes.
template <typename Storage>
Storage& Garbage(std::unique_ptr<Storage>& storage) {
  if (storage == nullptr) storage = std::make_unique<Storage>();
  std::memset(static_cast<void*>(storage.get()), 0xFF, sizeof(Storage));
  return *storage;
}

}  // namespace

template <KvType kKv, int kHeadDim>
cudaError_t LaunchPrefill(const AttentionParams& p, cudaStream_t) {
  std::unique_ptr<TileStorage<kHeadDim>> sm;
  for (int item = 0; item < p.num_items; ++item) {
    for (int h = 0; h < p.kv.num_kv_heads; ++h) {
      auto& storage = Garbage(sm);
      RunBlock(kAttentionThreads, [&] { PrefillBlock<kKv, kHeadDim>(p, item, h, storage); });
    }
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

template <KvType kKv, int kHeadDim>
cudaError_t LaunchMmaPrefill(const AttentionParams& p, cudaStream_t) {
  constexpr simt::Half16 kType = kKv == KvType::kBF16 ? simt::Half16::kBF16 : simt::Half16::kF16;
  std::unique_ptr<MmaPrefillStorage<kHeadDim>> sm;
  for (int item = 0; item < p.num_items; ++item) {
    for (int h = 0; h < p.kv.num_kv_heads; ++h) {
      auto& storage = Garbage(sm);
      RunBlock(kMmaPrefillThreads, [&] { MmaPrefillBlock<kType, kHeadDim>(p, item, h, storage); });
    }
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

template <KvType kKv, int kHeadDim>
cudaError_t LaunchPagedDecode(const AttentionParams& p, int row_blocks, cudaStream_t) {
  std::unique_ptr<TileStorage<kHeadDim>> sm;
  for (int item = 0; item < p.num_items; ++item) {
    for (int h = 0; h < p.kv.num_kv_heads; ++h) {
      for (int z = 0; z < row_blocks; ++z) {
        auto& storage = Garbage(sm);
        RunBlock(kAttentionThreads,
                 [&] { PagedDecodeBlock<kKv, kHeadDim>(p, item, h, z, storage); });
      }
    }
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

// The instantiations the .cu files make: CUDA-core prefill for f32 pages and for every page type
// at head dim 256, tensor-core prefill for 16-bit pages at 64 and 128, decode for all.
template cudaError_t LaunchPrefill<KvType::kF32, 64>(const AttentionParams&, cudaStream_t);
template cudaError_t LaunchPrefill<KvType::kF32, 128>(const AttentionParams&, cudaStream_t);
template cudaError_t LaunchPrefill<KvType::kF32, 256>(const AttentionParams&, cudaStream_t);
template cudaError_t LaunchPrefill<KvType::kF16, 256>(const AttentionParams&, cudaStream_t);
template cudaError_t LaunchPrefill<KvType::kBF16, 256>(const AttentionParams&, cudaStream_t);
// 8-bit pages: CUDA-core prefill at every head dim.
#define ATTNSERVE_EMULATED_PREFILL(KV)                                                  \
  template cudaError_t LaunchPrefill<KV, 64>(const AttentionParams&, cudaStream_t);  \
  template cudaError_t LaunchPrefill<KV, 128>(const AttentionParams&, cudaStream_t); \
  template cudaError_t LaunchPrefill<KV, 256>(const AttentionParams&, cudaStream_t);
ATTNSERVE_EMULATED_PREFILL(KvType::kFp8)
ATTNSERVE_EMULATED_PREFILL(KvType::kInt8)
#undef ATTNSERVE_EMULATED_PREFILL
template cudaError_t LaunchMmaPrefill<KvType::kF16, 64>(const AttentionParams&, cudaStream_t);
template cudaError_t LaunchMmaPrefill<KvType::kF16, 128>(const AttentionParams&, cudaStream_t);
template cudaError_t LaunchMmaPrefill<KvType::kBF16, 64>(const AttentionParams&, cudaStream_t);
template cudaError_t LaunchMmaPrefill<KvType::kBF16, 128>(const AttentionParams&, cudaStream_t);
#define ATTNSERVE_EMULATED_DECODE(KV)                                                        \
  template cudaError_t LaunchPagedDecode<KV, 64>(const AttentionParams&, int, cudaStream_t); \
  template cudaError_t LaunchPagedDecode<KV, 128>(const AttentionParams&, int, cudaStream_t); \
  template cudaError_t LaunchPagedDecode<KV, 256>(const AttentionParams&, int, cudaStream_t);
ATTNSERVE_EMULATED_DECODE(KvType::kF32)
ATTNSERVE_EMULATED_DECODE(KvType::kF16)
ATTNSERVE_EMULATED_DECODE(KvType::kBF16)
ATTNSERVE_EMULATED_DECODE(KvType::kFp8)
ATTNSERVE_EMULATED_DECODE(KvType::kInt8)
#undef ATTNSERVE_EMULATED_DECODE

cudaError_t LaunchCombineSplits(const AttentionParams& p, cudaStream_t) {
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_heads; ++h) {
      RunBlock(p.kv.head_dim, [&] { CombineSplitsBlock(p, b, h); });
    }
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

cudaError_t LaunchRopeAppend(const RopeAppendParams& p, cudaStream_t) {
  if (p.rope.pairs() > kMaxHalfRotary) return cudaErrorInvalidValue;
  std::unique_ptr<RopeAppendStorage> sm;
  for (int row = 0; row < p.rows; ++row) {
    auto& storage = Garbage(sm);
    RunBlock(kRopeAppendThreads, [&] {
      switch (p.kv_type) {
        case KvType::kF32:
          RopeAppendBlock<KvType::kF32>(p, row, storage);
          break;
        case KvType::kF16:
          RopeAppendBlock<KvType::kF16>(p, row, storage);
          break;
        case KvType::kBF16:
          RopeAppendBlock<KvType::kBF16>(p, row, storage);
          break;
        case KvType::kFp8:
        case KvType::kInt8:  // RoPE only: the block returns before its append.
          RopeAppendBlock<KvType::kF32>(p, row, storage);
          break;
      }
    });
  }
  if (IsQuantized(p.kv_type)) {  // Then the 8-bit append, as the real launcher.
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < p.kv.num_kv_heads; ++h) {
        for (int is_value = 0; is_value < 2; ++is_value) {
          RunBlock(kQuantizedAppendThreads, [&] {
            if (p.kv_type == KvType::kFp8) {
              QuantizedAppendBlock<true>(p, b, h, is_value);
            } else {
              QuantizedAppendBlock<false>(p, b, h, is_value);
            }
          });
        }
      }
    }
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

// Element-wise kernels: plain loops (nothing block-shaped to emulate).
cudaError_t LaunchBroadcastRows(float* dst, const float* bias, int rows, int cols, cudaStream_t) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * cols, bias, sizeof(float) * cols);
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

cudaError_t LaunchFindNonFinite(const float* data, int64_t count, float limit,
                                unsigned long long* first_bad, cudaStream_t) {
  for (int64_t e = 0; e < count; ++e) {
    if (!std::isfinite(data[e]) || std::fabs(data[e]) >= limit) {
      *first_bad = std::min(*first_bad, static_cast<unsigned long long>(e));
      break;
    }
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

cudaError_t LaunchConvertFloats(const float* src, KvType dst_type, void* dst, int64_t count,
                                cudaStream_t) {
  if (dst_type == KvType::kF32) return cudaErrorInvalidValue;
  // Round to nearest even, as the device's __float2half_rn / __float2bfloat16_rn.
  ConvertFromFloat(src, dst_type == KvType::kF16 ? DType::kF16 : DType::kBF16, dst,
                   static_cast<size_t>(count));
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

cudaError_t LaunchConvertActivations(const void* src, KvType src_type, void* dst,
                                     KvType dst_type, int64_t count, cudaStream_t) {
  auto dtype = [](KvType t) {
    return t == KvType::kF16 ? DType::kF16 : t == KvType::kBF16 ? DType::kBF16 : DType::kF32;
  };
  if (IsQuantized(src_type) || IsQuantized(dst_type)) return cudaErrorInvalidValue;
  // Through fp32 as the device kernel: widening is exact, narrowing rounds to nearest even.
  std::vector<float> wide(static_cast<size_t>(count));
  ConvertToFloat(dtype(src_type), src, wide.data(), wide.size());
  ConvertFromFloat(wide.data(), dtype(dst_type), dst, wide.size());
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

}  // namespace attnserve::cuda

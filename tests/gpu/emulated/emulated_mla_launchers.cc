// The MLA kernel launchers of kernels/cuda/mla/mla_params.h for the emulated device: every block
// of the grid, one after another, on the CPU block emulator, running the kernels' own block
// functions (mla_attention.cuh, mla_latent.cuh). Dynamic shared memory is a float buffer of the
// launch's size, NaN bytes at the start of every block as garbage would be on a GPU.
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/mla/mla_attention.cuh"
#include "kernels/cuda/mla/mla_latent.cuh"
#include "kernels/cuda/mla/mla_params.h"
#include "kernels/cuda/simt/simt_emulator.h"

namespace attnserve::cuda {

namespace {

using simt::emulator::RunBlock;

float* Garbage(std::vector<float>& storage, size_t words) {
  storage.resize(words);
  std::memset(static_cast<void*>(storage.data()), 0xFF, words * sizeof(float));
  return storage.data();
}

int Chunks(int rows) { return (rows + kMlaProjectionRows - 1) / kMlaProjectionRows; }

}  // namespace

template <KvType kKv>
cudaError_t LaunchMlaPrefill(const MlaAttentionParams& p, cudaStream_t) {
  const MlaTileLayout tile(p.kv.latent_dim, p.kv.rope_dim);
  if (tile.bytes() > kMlaMaxSharedBytes) return cudaErrorInvalidValue;
  std::vector<float> sm;
  for (int item = 0; item < p.num_items; ++item) {
    float* smem = Garbage(sm, tile.words);
    RunBlock(kMlaThreads, [&] { MlaPrefillBlock<kKv>(p, item, smem); });
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

template <KvType kKv>
cudaError_t LaunchMlaDecode(const MlaAttentionParams& p, cudaStream_t) {
  const MlaTileLayout tile(p.kv.latent_dim, p.kv.rope_dim);
  if (tile.bytes() > kMlaMaxSharedBytes) return cudaErrorInvalidValue;
  std::vector<float> sm;
  const int row_blocks = (p.num_heads + kMlaRowsPerBlock - 1) / kMlaRowsPerBlock;
  for (int item = 0; item < p.num_items; ++item) {
    for (int z = 0; z < row_blocks; ++z) {
      float* smem = Garbage(sm, tile.words);
      RunBlock(kMlaThreads, [&] { MlaDecodeBlock<kKv>(p, item, z, smem); });
    }
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

#define ATTNSERVE_EMULATED_MLA(KV)                                                      \
  template cudaError_t LaunchMlaPrefill<KV>(const MlaAttentionParams&, cudaStream_t); \
  template cudaError_t LaunchMlaDecode<KV>(const MlaAttentionParams&, cudaStream_t);
ATTNSERVE_EMULATED_MLA(KvType::kF32)
ATTNSERVE_EMULATED_MLA(KvType::kF16)
ATTNSERVE_EMULATED_MLA(KvType::kBF16)
ATTNSERVE_EMULATED_MLA(KvType::kFp8)
ATTNSERVE_EMULATED_MLA(KvType::kInt8)
#undef ATTNSERVE_EMULATED_MLA

cudaError_t LaunchMlaAppend(const MlaAppendParams& p, cudaStream_t) {
  MlaAppendStorage sm;
  for (int row = 0; row < p.rows; ++row) {
    std::memset(static_cast<void*>(&sm), 0xFF, sizeof(sm));
    RunBlock(kMlaLatentThreads, [&] {
      switch (p.kv_type) {
        case KvType::kF32:
          MlaAppendBlock<KvType::kF32>(p, row, sm);
          break;
        case KvType::kF16:
          MlaAppendBlock<KvType::kF16>(p, row, sm);
          break;
        case KvType::kBF16:
          MlaAppendBlock<KvType::kBF16>(p, row, sm);
          break;
        case KvType::kFp8:
          MlaAppendBlock<KvType::kFp8>(p, row, sm);
          break;
        case KvType::kInt8:
          MlaAppendBlock<KvType::kInt8>(p, row, sm);
          break;
      }
    });
  }
  if (IsQuantized(p.kv_type)) {  // The second kernel, after every row's norms and RoPE.
    for (int b = 0; b < p.batch; ++b) {
      for (int segment = 0; segment < MlaPageScaleCount(); ++segment) {
        RunBlock(kMlaQuantizedAppendThreads, [&] {
          if (p.kv_type == KvType::kFp8) {
            MlaQuantizedAppendBlock<true>(p, b, segment);
          } else {
            MlaQuantizedAppendBlock<false>(p, b, segment);
          }
        });
      }
    }
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

cudaError_t LaunchMlaQuery(const MlaQueryParams& p, cudaStream_t) {
  std::vector<float> sm;
  for (int h = 0; h < p.num_heads; ++h) {
    for (int chunk = 0; chunk < Chunks(p.rows); ++chunk) {
      float* smem = Garbage(sm, size_t{kMlaProjectionRows} * p.nope);
      RunBlock(kMlaLatentThreads, [&] { MlaQueryBlock(p, h, chunk, smem); });
    }
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

cudaError_t LaunchMlaOutput(const MlaOutputParams& p, cudaStream_t) {
  std::vector<float> sm;
  for (int h = 0; h < p.num_heads; ++h) {
    for (int chunk = 0; chunk < Chunks(p.rows); ++chunk) {
      float* smem = Garbage(sm, size_t{kMlaProjectionRows} * p.latent);
      RunBlock(kMlaLatentThreads, [&] { MlaOutputBlock(p, h, chunk, smem); });
    }
  }
  return cudaGetLastError();  // As the real launchers: reports any pending error.
}

}  // namespace attnserve::cuda

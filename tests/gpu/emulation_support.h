// Setup shared by the CPU-emulation tests of the CUDA attention kernels (*_emulation_test.cc):
// a paged KV batch laid out as the kernels read it, poisoned with NaN wherever nothing was
// written, and the float64 attention those tests check the kernels against. Written
// independently of the kernels' own element and page code, so a mistake there is not mirrored.
#ifndef ATTNSERVE_TESTS_GPU_EMULATION_SUPPORT_H_
#define ATTNSERVE_TESTS_GPU_EMULATION_SUPPORT_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/core/tensor.h"
#include "kernels/cuda/attention/params.h"

namespace attnserve::cuda::emulation {

// Bytes of one page element of `type`.
int ElementBytes(KvType type);
// The engine's DType of a page type (the dispatch takes DType).
DType ToDType(KvType type);

// Writes `x` rounded to nearest even in `type` at `dst` and returns the value stored.
double StoreElement(float x, KvType type, void* dst);

// The `type` element at `src`.
double LoadElement(const void* src, KvType type);

// A fresh random seed; prints "[case] <name> seed=<seed>" first, so a failing draw can be rerun.
uint64_t DrawCaseSeed(const std::string& case_name);

struct SequenceShape {
  int first_index;  // Tokens already cached.
  int num_new;      // New tokens (rows) in this call; decode: 1.
};

// A batch of sequences over a paged KV pool. Page layout as PagedKv: [K|V][kv_heads][page_size]
// [head_dim].
struct PagedBatch {
  KvType type = KvType::kF32;
  int kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  MaskSpec mask;
  // Rows in sequence order (first_row = rows of the sequences before); a test may reorder them.
  std::vector<SequenceDesc> sequences;
  int rows = 0;
  int pool_pages = 0;  // The sequences' pages and a few spare ones, which stay NaN.
  // 0xFF bytes, NaN in every KvType, except the elements written. uint32_t keeps f32 aligned.
  std::vector<uint32_t> pool;
  // Bytes from the pool base, in shuffled order; -1 for a page behind every new token's window.
  std::vector<int64_t> page_offsets;
  // keys[b][j] / values[b][j]: key j of sequence b as stored (rounded to `type`), KV head h at
  // [h * head_dim]. Empty until written (MakePagedBatch).
  std::vector<std::vector<std::vector<double>>> keys, values;

  int64_t PageElements() const { return 2 * int64_t{kv_heads} * page_size * head_dim; }
  // The pool element at index `element` (elements of `type` from the pool base).
  double PoolElement(int64_t element) const;
  // The kernels' page table over `pool`.
  PagedKv Kv();
};

// The sequences of `shapes`, their pages scattered over a NaN pool (the order drawn from `rng`),
// the pages that `mask` puts behind every new token evicted (-1). Writes nothing: the test's
// kernel is to fill the pages (pass a mask without window to evict none).
PagedBatch LayOutPagedBatch(const std::vector<SequenceShape>& shapes, KvType type, int kv_heads,
                            int head_dim, int page_size, const MaskSpec& mask,
                            std::mt19937_64& rng);

// LayOutPagedBatch, then every token's K and V drawn from N(0, 1), rounded to `type` and written
// to its page (not to an evicted one: written once, evicted since), and kept in keys/values.
PagedBatch MakePagedBatch(const std::vector<SequenceShape>& shapes, KvType type, int kv_heads,
                          int head_dim, int page_size, const MaskSpec& mask, std::mt19937_64& rng);

// [rows, q_stride] as the qkv buffer: q drawn from N(0, 1) in each row's first `q_width` columns,
// NaN in the rest (the K/V columns), so a wrong stride reads NaN.
std::vector<float> RandomQueries(int rows, int64_t q_stride, int64_t q_width, std::mt19937_64& rng);

// AttentionParams for attention over `batch` (its page table, sequences and mask) of the q rows
// in `qkv` into `out`, with the 1/sqrt(head_dim) scale; the test adds its planned work items.
AttentionParams MakeAttentionParams(PagedBatch& batch, const std::vector<float>& qkv,
                                    int64_t q_stride, int heads, int group,
                                    std::vector<float>& out);

// Float64 attention of every new token of `batch` over its stored keys and values: query head
// `head` of row r at q[r * q_stride + head * head_dim], of KV head head / group, under batch.mask.
// Returns [batch.rows, heads, head_dim] with row = first_row + t, as the kernels write it, so any
// row order of batch.sequences (decode's reversed one) carries over. soft_cap > 0 caps each scaled
// score s to soft_cap * tanh(s / soft_cap) before the softmax (Gemma 2's logit soft-capping).
std::vector<double> ReferenceAttention(const PagedBatch& batch, const float* q, int64_t q_stride,
                                       int heads, int group, double scale, double soft_cap = 0.0);

struct OutputError {
  double relative;    // ||actual - expected||_2 / ||expected||_2.
  int64_t nan_count;  // NaN outputs: left unwritten or computed from poisoned memory.
};
OutputError CompareWithReference(const std::vector<float>& actual,
                                 const std::vector<double>& expected);

}  // namespace attnserve::cuda::emulation

#endif  // ATTNSERVE_TESTS_GPU_EMULATION_SUPPORT_H_

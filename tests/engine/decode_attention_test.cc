// The paged decode attention kernel (kernels/cpu/decode_attention.cc, with the group loops of
// simd_kernels.h and their AVX-512 tiles in simd_kernels.cc) alone, on random q and random KV
// pages, against a float64 attention written here from the hooks' definitions. ctest runs this
// binary three times: as is (AVX-512 where the CPU has it), with ATTNSERVE_CPU_AVX512=0 (AVX2) and
// with ATTNSERVE_CPU_PORTABLE=1 (the portable loops).
//
// Sizes cross every boundary of the kernel: sequences of 1, 3, 17, 130, 301 and 1031 keys (odd
// counts: partial 4- and 8-key score tiles, partial pages of 16 and 64 tokens, 128-key softmax
// blocks), one batch of all of them and one long sequence alone (split over the threads and
// combined); groups 1-8, 10-12 and 16 query rows per KV head; head dims 64, 48, 80 (the AVX-512
// tiles' 64- and 16-column accumulators), 24 (AVX2 only) and 20 (portable only); absorbed MLA rows
// (key 288 = latent 256 + RoPE 32, value = the latent) on 64-token pages; sliding windows,
// soft-cap, sinks, ALiBi and a non-causal mask. Page ids are shuffled and every page is poisoned
// with NaN before its rows are written, so a read past a sequence's last token fails the test.
//
// Tolerance: relative 2-norm over the whole output, 2e-5 for f32 and bf16 pages alike. The
// reference reads the rows back from the pages (bf16 rounding included), so both dtypes compare
// float32 compute against exact arithmetic on the same K/V: dot products of at most 288 terms and
// sums of at most 1031 weights (u = 6e-8; ExpApprox's relative error < 2e-7) give errors ~1e-6,
// while a key off by one or a wrong split combine moves the output by > 1e-3.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/core/tensor.h"
#include "kernels/cpu/decode_attention.h"
#include "kernels/cpu/gqa_layer.h"
#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/mla_layer.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv/cache_config.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/spec/layer_spec.h"
#include "tests/reference/test_cases.h"

namespace attnserve {
namespace {

struct DecodeCase {
  std::string name;
  bool mla = false;  // One latent "KV head" (key = latent + RoPE, value = latent), 64-token pages.
  int kv_heads = 1;
  int group = 1;  // Query rows per KV head (MLA: the heads).
  int key_dim = 64;
  int value_dim = 64;
  DType dtype = DType::kF32;
  bool causal = true;
  int64_t window = 0;
  float softcap = 0.0f;
  bool sinks = false;
  int alibi = 0;  // AlibiBias::kind.
};

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

KvPageLayout LayoutFor(const DecodeCase& c) {
  LayerSpec spec;
  KvCacheConfig kv;
  kv.storage = c.dtype;
  if (c.mla) {
    spec.variant = AttentionVariant::kMLA;
    spec.mla.kv_lora_rank = c.value_dim;
    spec.mla.qk_rope_head_dim = c.key_dim - c.value_dim;
    kv.page_size = 64;
    return MlaLayer::MakePageLayout(spec, kv);
  }
  spec.num_kv_heads = c.kv_heads;
  spec.head_dim = c.key_dim;
  kv.page_size = 16;
  return GqaLayer::MakePageLayout(spec, kv);
}

// Output row of query head h (of KV head h / group) of the new token at index length - 1, in
// float64 from the definitions: logits scale q.k, soft-capped cap tanh(s / cap), plus
// slope_h (key - query); the sink's logit joins the softmax denominator only.
std::vector<double> ReferenceRow(const DecodeCase& c, const AttentionVariation& v, const float* q,
                                 const KvPageLayout& layout, const HostPageStore& store,
                                 const PageTable& table, int h) {
  const int64_t query = table.num_tokens - 1;
  const KeyRange keys = v.mask.VisibleKeys(query, table.num_tokens);
  const int kv_head = h / c.group;
  std::vector<float> key(c.key_dim), value(c.value_dim);
  std::vector<double> logits, out(c.value_dim, 0.0);
  for (int64_t k = keys.begin; k < keys.end; ++k) {
    const std::byte* page = store.page(table.PageOf(k, layout.page_size));
    ReadPageRow(layout, page, kv_head, /*value=*/false, static_cast<int>(k % layout.page_size),
                c.key_dim, key.data());
    double dot = 0.0;
    for (int d = 0; d < c.key_dim; ++d) dot += double{q[d]} * key[d];
    double s = double{v.scale} * dot;
    if (c.softcap > 0.0f) s = c.softcap * std::tanh(s / c.softcap);
    if (c.alibi != 0) s += double{v.alibi.Slope(h)} * static_cast<double>(k - query);
    logits.push_back(s);
  }
  double max = c.sinks ? double{v.sinks.logits[h]} : -INFINITY;
  for (double s : logits) max = std::max(max, s);
  double sum = c.sinks ? std::exp(v.sinks.logits[h] - max) : 0.0;
  for (int64_t k = keys.begin; k < keys.end; ++k) {
    const std::byte* page = store.page(table.PageOf(k, layout.page_size));
    ReadPageRow(layout, page, kv_head, /*value=*/true, static_cast<int>(k % layout.page_size),
                c.value_dim, value.data());
    const double w = std::exp(logits[k - keys.begin] - max);
    sum += w;
    for (int d = 0; d < c.value_dim; ++d) out[d] += w * value[d];
  }
  for (double& x : out) x /= sum;
  return out;
}

class DecodeAttentionKernelTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeAttentionKernelTest, MatchesFloat64) {
  const DecodeCase& c = GetParam();
  const uint64_t seed = reference::TestSeed();
  SCOPED_TRACE(reference::SeedNote(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const int heads = c.kv_heads * c.group;
  std::vector<float> sinks(heads);
  std::uniform_real_distribution<float> sink_logit(-1.0f, 3.0f);
  for (float& x : sinks) x = sink_logit(rng);

  DecodeAttentionParams p;
  p.num_kv_heads = c.kv_heads;
  p.rows_per_kv_head = c.group;
  p.key_dim = c.key_dim;
  p.value_dim = c.value_dim;
  p.layout = LayoutFor(c);
  p.variation.scale = 1.0f / std::sqrt(static_cast<float>(c.key_dim));
  p.variation.mask = {c.causal, c.window};
  p.variation.softcap.cap = c.softcap;
  p.variation.alibi = {c.alibi, heads, 8.0f};
  p.variation.sinks.logits = c.sinks ? sinks.data() : nullptr;
  HostPageStore store(p.layout.page_elements * DTypeSize(c.dtype));
  ThreadPool pool(3);

  // One batch of every length, then the longest alone (split over the threads).
  const std::vector<std::vector<int64_t>> batches = {{1, 3, 17, 130, 301, 1031}, {1031}};
  int32_t next_page = 0;
  for (const std::vector<int64_t>& lengths : batches) {
    p.batch = static_cast<int>(lengths.size());
    std::vector<PageTable> tables(lengths.size());
    std::vector<int32_t> ids;
    for (size_t b = 0; b < lengths.size(); ++b) {
      for (int64_t i = 0; i < PagesForTokens(lengths[b], p.layout.page_size); ++i) {
        ids.push_back(next_page++);
      }
    }
    ASSERT_TRUE(store.Commit(ids).ok());
    std::shuffle(ids.begin(), ids.end(), rng);
    const std::vector<float> poison(p.layout.page_elements,
                                    std::numeric_limits<float>::quiet_NaN());
    std::vector<float> row(std::max(c.key_dim, c.value_dim));
    size_t next_id = 0;
    for (size_t b = 0; b < lengths.size(); ++b) {
      PageTable& table = tables[b];
      table.num_tokens = lengths[b];
      for (int64_t i = 0; i < PagesForTokens(lengths[b], p.layout.page_size); ++i) {
        table.pages.push_back(ids[next_id++]);
        ConvertFromFloat(poison.data(), c.dtype, store.page(table.pages.back()), poison.size());
      }
      for (int64_t t = 0; t < lengths[b]; ++t) {
        std::byte* page = store.page(table.PageOf(t, p.layout.page_size));
        const int slot = static_cast<int>(t % p.layout.page_size);
        for (int h = 0; h < c.kv_heads; ++h) {
          // Logits of a few units, so soft-cap and the max subtraction matter.
          for (int d = 0; d < c.key_dim; ++d) row[d] = 2.0f * normal(rng);
          WritePageRow(p.layout, page, h, /*value=*/false, slot, row.data(), c.key_dim);
          if (c.mla) continue;  // The value is the key's latent part.
          for (int d = 0; d < c.value_dim; ++d) row[d] = normal(rng);
          WritePageRow(p.layout, page, h, /*value=*/true, slot, row.data(), c.value_dim);
        }
      }
    }
    std::vector<const PageTable*> table_pointers;
    for (const PageTable& table : tables) table_pointers.push_back(&table);
    std::vector<float> q(lengths.size() * heads * c.key_dim);
    for (float& x : q) x = normal(rng);
    std::vector<float> out(lengths.size() * heads * c.value_dim,
                           std::numeric_limits<float>::quiet_NaN());
    p.q = q.data();
    p.out = out.data();
    p.store = &store;
    p.tables = table_pointers;
    PagedDecodeAttention(p, pool);

    double error_sq = 0.0, norm_sq = 0.0;
    for (size_t b = 0; b < lengths.size(); ++b) {
      for (int h = 0; h < heads; ++h) {
        const int64_t first = (static_cast<int64_t>(b) * heads + h);
        const std::vector<double> expected = ReferenceRow(
            c, p.variation, &q[first * c.key_dim], p.layout, store, tables[b], h);
        for (int d = 0; d < c.value_dim; ++d) {
          const double diff = out[first * c.value_dim + d] - expected[d];
          error_sq += diff * diff;
          norm_sq += expected[d] * expected[d];
        }
      }
    }
    const double relative = std::sqrt(error_sq / norm_sq);
    EXPECT_LE(relative, 2e-5) << "batch of " << lengths.size() << " (NaN: a poisoned slot read)";
  }
}

std::vector<DecodeCase> Cases() {
  std::vector<DecodeCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string kv = dtype == DType::kF32 ? "_f32" : "_bf16";
    cases.push_back({"mha_d64" + kv, false, 4, 1, 64, 64, dtype});
    cases.push_back({"gqa4_d64_alibi" + kv, false, 2, 4, 64, 64, dtype, true, 0, 0.0f, false, 1});
    cases.push_back({"mqa8_d64_sinks" + kv, false, 1, 8, 64, 64, dtype, true, 0, 0.0f, true});
    cases.push_back({"gqa3_d80_softcap_sinks" + kv, false, 3, 3, 80, 80, dtype, true, 0, 1.5f,
                     true});
    cases.push_back({"mla16_k288_v256" + kv, true, 1, 16, 288, 256, dtype});
    cases.push_back({"mla8_k96_v64_window100_softcap" + kv, true, 1, 8, 96, 64, dtype, true, 100,
                     1.5f});
  }
  cases.push_back({"gqa2_d48_window100", false, 2, 2, 48, 48, DType::kF32, true, 100});
  cases.push_back({"gqa5_d32_noncausal", false, 1, 5, 32, 32, DType::kF32, false});
  cases.push_back({"gqa6_d64_window7", false, 1, 6, 64, 64, DType::kBF16, true, 7});
  // SmolLM2-135M's shape: 3 KV heads of 3 query rows (the AVX-512 3-row tiles, 64 columns).
  cases.push_back({"smol_gqa3_d64", false, 3, 3, 64, 64, DType::kF32});
  cases.push_back({"gqa7_d16_mpt", false, 2, 7, 16, 16, DType::kF32, true, 0, 0.0f, false, 2});
  cases.push_back({"gqa4_d24_avx2_only", false, 2, 4, 24, 24, DType::kF32});
  cases.push_back({"gqa2_d20_portable_only", false, 2, 2, 20, 20, DType::kBF16, true, 0, 1.5f});
  // Groups past 8 rows: the AVX-512 8-row tiles, then what is left in a quad (12), a triple (11)
  // or a pair (10).
  cases.push_back({"mqa12_d48", false, 1, 12, 48, 48, DType::kBF16});
  cases.push_back({"gqa11_d64_bf16", false, 2, 11, 64, 64, DType::kBF16});
  cases.push_back({"gqa10_d112_softcap", false, 2, 10, 112, 112, DType::kF32, true, 0, 1.5f});
  // 32 heads x 288 columns: four 8-row groups of a wide q (GroupScoresQuery's layout, bf16 in
  // even/odd order; until it was laid out once per call, past the per-block copy on the stack).
  cases.push_back({"mla32_k288_v256_bf16", true, 1, 32, 288, 256, DType::kBF16});
  cases.push_back({"mla32_k288_v256_f32", true, 1, 32, 288, 256, DType::kF32});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Variations, DecodeAttentionKernelTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace attnserve

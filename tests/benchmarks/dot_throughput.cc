// Instructions per ns of one core's CPU time for 16 independent chains of zmm vfmadd231ps, zmm
// vdpbf16ps and ymm vdpbf16ps (a zmm FMA is 16 multiply-adds, a zmm vdpbf16ps 32, a ymm one 16):
// whether bf16 dot products can beat widening bf16 to f32 on this CPU. docs/benchmarks.md, "bf16
// dot products for grouped decode", records its output. Not a test; x86-64 only.
#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <ctime>

namespace {

constexpr int kChains = 16;
constexpr int64_t kSteps = 20'000'000;

double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The empty asm makes one operand opaque each step, so no product is hoisted out of the loop.
__attribute__((target("avx512f"), noinline)) float FmaZmm(float x) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512 a = _mm512_set1_ps(x), b = _mm512_set1_ps(x * 0.5f);
  for (int64_t k = 0; k < kSteps; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
    __asm__("" : "+v"(a));
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return lanes[0];
}

__attribute__((target("avx512f,avx512bf16"), noinline)) float DotZmm(float x) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(x), _mm512_set1_ps(x));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f * x), _mm512_set1_ps(0.5f * x));
  for (int64_t k = 0; k < kSteps; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__("" : "+v"(a));
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return lanes[0];
}

__attribute__((target("avx512f,avx512vl,avx512bf16"), noinline)) float DotYmm(float x) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  __m256bh a = _mm256_cvtne2ps_pbh(_mm256_set1_ps(x), _mm256_set1_ps(x));
  const __m256bh b = _mm256_cvtne2ps_pbh(_mm256_set1_ps(0.5f * x), _mm256_set1_ps(0.5f * x));
  for (int64_t k = 0; k < kSteps; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_dpbf16_ps(acc[i], a, b);
    __asm__("" : "+v"(a));
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  return lanes[0];
}

template <typename F>
void Report(const char* name, int multiply_adds, F f) {
  const double start = ThreadSeconds();
  const volatile float sink = f(1.0f);
  (void)sink;
  const double ns = 1e9 * (ThreadSeconds() - start);
  const double per_ns = static_cast<double>(kChains) * static_cast<double>(kSteps) / ns;
  std::printf("%-18s %5.2f per ns  %6.1f multiply-adds per ns\n", name, per_ns,
              per_ns * multiply_adds);
}

}  // namespace

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("no AVX-512F on this CPU\n");
    return 0;
  }
  for (int round = 0; round < 3; ++round) {
    Report("zmm vfmadd231ps", 16, FmaZmm);
    if (!__builtin_cpu_supports("avx512bf16")) {
      std::printf("no AVX512_BF16 on this CPU\n");
      continue;
    }
    Report("zmm vdpbf16ps", 32, DotZmm);
    Report("ymm vdpbf16ps", 16, DotYmm);
  }
  return 0;
}

// Which OpenBLAS kernels this process runs, and a way to name better ones before they load.
//
// OpenBLAS (a DYNAMIC_ARCH build, as Debian's) picks its kernels once, when the library loads,
// from the CPU's model number. A CPU newer than the library's table is not recognised and gets
// the Prescott (SSE3) kernels: Debian 12's OpenBLAS 0.3.21 on an Emerald Rapids Xeon (family 6,
// model 207) ran sgemm at 60 GFLOP/s on 2 cores against 249 with its SkylakeX kernels named by
// OPENBLAS_CORETYPE (docs/benchmarks.md). Every projection of more than 8 rows and the prefill's
// sgemm parts run through it, so a process that can only be configured after the library has
// loaded re-executes itself with the core named.
#ifndef ATTNSERVE_KERNELS_CPU_BLAS_CORE_H_
#define ATTNSERVE_KERNELS_CPU_BLAS_CORE_H_

#include <string>
#include <string_view>

namespace attnserve {

// What the CPU can run, as far as the choice of BLAS kernels goes.
struct CpuVectorFeatures {
  bool avx2_fma = false;  // AVX2 and FMA3.
  bool avx512 = false;    // AVX-512 F, BW, VL and DQ (what OpenBLAS's SkylakeX kernels use).
};

// The running CPU's features (from cpuid).
CpuVectorFeatures DetectCpuVectorFeatures();

// The OPENBLAS_CORETYPE to ask for when OpenBLAS chose `chosen_core` on a CPU with `features`,
// or "" to keep its choice. Only a choice without AVX2 kernels on a CPU that has AVX2 and FMA is
// replaced (the fallback for an unrecognised CPU); a recognised core is never second-guessed.
std::string BetterBlasCore(std::string_view chosen_core, const CpuVectorFeatures& features);

// The core OpenBLAS runs in this process (openblas_get_corename).
std::string BlasCoreName();

// When OPENBLAS_CORETYPE is unset and BetterBlasCore names a core, sets it and re-executes this
// program (/proc/self/exe, same arguments and process id), so the library loads with that core;
// returns only when nothing needs doing or the exec failed (said on stderr). Call first in main.
void ReexecForBetterBlasCore(char** argv);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_BLAS_CORE_H_

#include "kernels/cpu/blas_core.h"

#include <cblas.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/container/flat_hash_set.h"

namespace attnserve {

CpuVectorFeatures DetectCpuVectorFeatures() {
  CpuVectorFeatures f;
#if defined(__x86_64__)
  __builtin_cpu_init();
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif  // Elsewhere: no x86 vector units, so OpenBLAS's choice is never replaced.
  return f;
}

std::string BetterBlasCore(std::string_view chosen_core, const CpuVectorFeatures& features) {
  // OpenBLAS's x86-64 cores that have AVX2 (or better) kernels, by the names openblas_get_corename
  // gives (case differs between versions).
  static const absl::flat_hash_set<std::string>* const kAvx2Cores =
      new absl::flat_hash_set<std::string>{"haswell",    "zen",            "skylakex",
                                           "cooperlake", "sapphirerapids", "excavator"};
  if (!features.avx2_fma) return "";
  std::string lower(chosen_core);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (kAvx2Cores->contains(lower)) return "";
  return features.avx512 ? "SkylakeX" : "Haswell";
}

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name == nullptr ? "" : name;
}

void ReexecForBetterBlasCore(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // Named by the operator: kept.
  const std::string chosen = BlasCoreName();
  const std::string better = BetterBlasCore(chosen, DetectCpuVectorFeatures());
  if (better.empty()) return;
  setenv("OPENBLAS_CORETYPE", better.c_str(), /*overwrite=*/1);
  execv("/proc/self/exe", argv);
  // Still here: the exec failed. Run on with the slower kernels rather than not at all.
  std::fprintf(stderr,
               "attnserve: OpenBLAS chose its %s kernels on a CPU with %s; re-executing with "
               "OPENBLAS_CORETYPE=%s failed (%s); running on with %s\n",
               chosen.c_str(), better == "SkylakeX" ? "AVX-512" : "AVX2", better.c_str(),
               std::strerror(errno), chosen.c_str());
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace attnserve

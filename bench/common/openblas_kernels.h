#pragma once

// Note [OpenBLAS on CPUs it does not know] (src/util/openblas_core.h): OpenBLAS picks its
// kernels when the binary loads, and a benchmark's ranks inherit the environment. A benchmark
// calls this first thing in main: when OpenBLAS fell back to its generic kernels on a CPU that
// has better ones, it restarts itself once with OPENBLAS_CORETYPE set (its ranks then get it
// too), so its numbers are this CPU's, not the fallback's. OPENBLAS_CORETYPE already set (by
// the user, or by the restart) is kept.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "tdist/detail/util/openblas_core.h"

namespace bench_common {

inline void restart_with_openblas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const std::string core = tdist::detail::loaded_openblas_core();
  const char* fix = tdist::detail::openblas_coretype_fix(core);
  if (fix == nullptr) return;
  std::fprintf(stderr,
               "bench: OpenBLAS runs its generic %s kernels on this CPU; restarting with "
               "OPENBLAS_CORETYPE=%s\n",
               core.c_str(), fix);
  setenv("OPENBLAS_CORETYPE", fix, 1);
  execv("/proc/self/exe", argv);
  std::perror("bench: restart failed; going on with the generic kernels");
}

}  // namespace bench_common

#pragma once

// Note [OpenBLAS on CPUs it does not know]: LibTorch's matmuls run on the system BLAS, on
// Debian OpenBLAS built for every x86 kernel family, which picks one at load time from the
// CPU's model number. A CPU newer than that OpenBLAS (0.3.21 does not know Intel's model 207,
// Emerald Rapids, the machine this project is built on) falls back to the generic "Prescott"
// kernels: SSE3 only, a training step ~4x slower than with the AVX-512 kernels the same CPU
// runs when OPENBLAS_CORETYPE names them (bench/HISTORY.md). The choice is made
// when the library loads, so a process cannot fix its own: tdistrun sets OPENBLAS_CORETYPE
// for its workers when the system's OpenBLAS would fall back, and init_process_group warns a
// process that already did.

#include <string>

namespace tdist::detail {

/// The kernel family OpenBLAS chose in this process ("SkylakeX", "Prescott"); empty when no
/// OpenBLAS is loaded.
std::string loaded_openblas_core();

/// The kernel family the system's BLAS (libblas.so.3, loaded here and released) chooses for a
/// process started with this environment; empty when it is not OpenBLAS or cannot be loaded.
std::string system_openblas_core();

/// The OPENBLAS_CORETYPE that gives this CPU vector kernels when `core` is OpenBLAS's generic
/// fallback ("Prescott") and the CPU has AVX2 and FMA ("Haswell") or AVX-512 ("SkylakeX");
/// nullptr otherwise (nothing to fix, or nothing better on this CPU).
const char* openblas_coretype_fix(const std::string& core);

}  // namespace tdist::detail

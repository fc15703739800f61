#include "tdist/detail/util/openblas_core.h"

#include <dlfcn.h>

namespace tdist::detail {

namespace {

using CoreName = const char* (*)();

std::string core_name_from(void* handle) {
  auto get = reinterpret_cast<CoreName>(dlsym(handle, "openblas_get_corename"));
  const char* name = get ? get() : nullptr;
  return name ? name : "";
}

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512cd");
}

}  // namespace

std::string loaded_openblas_core() {
  return core_name_from(RTLD_DEFAULT);
}

std::string system_openblas_core() {
  void* blas = dlopen("libblas.so.3", RTLD_NOW | RTLD_LOCAL);
  if (!blas) return "";
  std::string name = core_name_from(blas);
  dlclose(blas);
  return name;
}

const char* openblas_coretype_fix(const std::string& core) {
#if defined(__x86_64__)
  // OpenBLAS's fallback for x86-64 CPUs it does not know; its name is lower-case in some
  // versions.
  if (core != "Prescott" && core != "prescott") return nullptr;
  __builtin_cpu_init();
  if (cpu_has_avx512()) return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#else
  (void)core;
#endif
  return nullptr;
}

}  // namespace tdist::detail

#pragma once

// The pause instruction of a spin-wait: tells the core this thread waits on memory another
// core writes (frees pipeline resources for a hyper-thread sibling, saves power), for the
// engines' flag waits.

namespace tdist::detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace tdist::detail

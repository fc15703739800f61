// What a same-host collective's copies cost when the data crosses cores: two processes,
// pinned to the first two CPUs of this process's affinity mask, take turns on one shared
// buffer (the writer copies BYTES in, then the reader copies them out), beside a private
// memcpy of the same size on each. A shared-memory collective does exactly this per piece.
//   gcc -O2 bench/memcpy/cross_core_copy.c -o /tmp/cross_core_copy && /tmp/cross_core_copy 524288
// On a VM the answer depends on where the host runs the two vCPUs, and moves while you watch
// (bench/RESULTS.md, session 6: writer 27 us one minute, 140 us ten minutes earlier, for
// 512 KiB): run it beside any collective benchmark whose numbers you compare across runs.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

// The n-th CPU (0-based) of this process's affinity mask, or -1.
static int nth_cpu(int n) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set) && n-- == 0) return cpu;
  }
  return -1;
}

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s BYTES\n", argv[0]);
    return 2;
  }
  const size_t n = strtoull(argv[1], NULL, 10);
  const int cpus[2] = {nth_cpu(0), nth_cpu(1)};
  if (n == 0 || cpus[1] < 0) {
    fprintf(stderr, "%s: needs BYTES > 0 and two CPUs\n", argv[0]);
    return 2;
  }
  int iters = (int)(1000000000 / n);
  if (iters < 20) iters = 20;
  char* shared = mmap(NULL, n + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return 1;
  memset(shared, 0, n + 4096);
  volatile long* turn = (volatile long*)(shared + n);  // even: the writer's, odd: the reader's

  const int reader = fork() == 0;
  pin(cpus[reader]);
  char* a = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  char* b = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  memset(a, 1 + reader, n);
  memset(b, 3 + reader, n);
  double crossing = 0;
  for (long i = 0; i < iters; ++i) {
    while (__atomic_load_n(turn, __ATOMIC_ACQUIRE) != 2 * i + reader) {
    }
    const double start = now_us();
    if (reader) {
      memcpy(a, shared, n);
    } else {
      memcpy(shared, a, n);
    }
    crossing += now_us() - start;
    __atomic_store_n(turn, 2 * i + reader + 1, __ATOMIC_RELEASE);
  }
  const double start = now_us();
  for (int i = 0; i < iters; ++i) {
    memcpy(i % 2 ? a : b, i % 2 ? b : a, n);
    __asm__ volatile("" ::: "memory");
  }
  const double private_us = (now_us() - start) / iters;
  if (reader)
    return printf("%zu: reader (cpu %d) %.1f us, private memcpy %.1f us\n", n, cpus[1],
                  crossing / iters, private_us) < 0;
  wait(NULL);
  printf("%zu: writer (cpu %d) %.1f us, private memcpy %.1f us\n", n, cpus[0], crossing / iters,
         private_us);
  return 0;
}

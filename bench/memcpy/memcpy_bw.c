// Memory-copy bandwidth of one process: the ceiling a same-host collective's copies run into.
//   gcc -O2 bench/memcpy/memcpy_bw.c -o /tmp/memcpy_bw && /tmp/memcpy_bw 67108864
// Start two at once (`/tmp/memcpy_bw N & /tmp/memcpy_bw N; wait`) to see what two ranks share.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s BYTES\n", argv[0]);
    return 2;
  }
  const size_t n = strtoull(argv[1], NULL, 10);
  char* a = malloc(n);
  char* b = malloc(n);
  if (!a || !b) return 1;
  memset(a, 1, n);
  memset(b, 2, n);
  int iters = (int)(2000000000 / n);
  if (iters < 5) iters = 5;
  const double start = now();
  for (int i = 0; i < iters; ++i) {
    memcpy(b, a, n);
    __asm__ volatile("" ::: "memory");  // keep every copy
  }
  const double seconds = now() - start;
  printf("%zu: memcpy %.2f GB/s\n", n, (double)n * iters / seconds / 1e9);
  return 0;
}

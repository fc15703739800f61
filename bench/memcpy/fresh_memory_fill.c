// What filling fresh memory from a file in the page cache costs, beside reading the same file
// into a reused buffer: the floor under loading a model into new FSDP shards
// (bench/RESULTS.md, "Models"). One file, one process; each mode times getting the file's
// bytes into newly allocated memory:
//   0 shared-memory object (shm_open, ftruncate, posix_fallocate, mmap), pread into it
//     (what FSDP's flat shards in symmetric memory and from_pretrained do)
//   1 the same without posix_fallocate
//   2 posix_fallocate, then sendfile into the object's file (no page of it faulted in)
//   3 sendfile without posix_fallocate
//   6 fresh anonymous memory, pread into it
//   7 the same with MADV_HUGEPAGE
//   8 pread into one reused 64 MiB buffer (reading the file once: the yardstick)
//   head -c 1073741824 /dev/urandom > /tmp/big && cat /tmp/big > /dev/null
//   gcc -O2 bench/memcpy/fresh_memory_fill.c -o /tmp/fill && for m in 8 0 1 2 3 6 7; do /tmp/fill /tmp/big $m; done
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { kChunk = 64 << 20 };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pread_all(int f, char* p, size_t len, int reuse) {
  for (size_t off = 0; off < len;) {
    const size_t n = len - off > kChunk ? kChunk : len - off;
    const ssize_t got = pread(f, reuse ? p : p + off, n, (off_t)off);
    if (got <= 0) {
      perror("pread");
      exit(1);
    }
    off += (size_t)got;
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s FILE MODE\n", argv[0]);
    return 2;
  }
  const int mode = atoi(argv[2]);
  const int f = open(argv[1], O_RDONLY);
  struct stat st;
  if (f < 0 || fstat(f, &st) != 0) {
    perror(argv[1]);
    return 1;
  }
  const size_t len = (size_t)st.st_size;
  char name[64];
  snprintf(name, sizeof name, "/fresh-fill-%d", getpid());
  const double start = now();
  char* p = NULL;
  if (mode <= 3) {
    const int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
      perror("shm_open");
      return 1;
    }
    if ((mode == 0 || mode == 2) && posix_fallocate(fd, 0, (off_t)len) != 0) {
      fprintf(stderr, "posix_fallocate failed\n");
      return 1;
    }
    if (mode >= 2) {
      for (off_t in = 0; (size_t)in < len;) {
        if (sendfile(fd, f, &in, len - (size_t)in) <= 0) {
          perror("sendfile");
          return 1;
        }
      }
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mode <= 1) pread_all(f, p, len, 0);
    close(fd);
  } else if (mode == 6 || mode == 7) {
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mode == 7) madvise(p, len, MADV_HUGEPAGE);
    pread_all(f, p, len, 0);
  } else if (mode == 8) {
    p = malloc(kChunk);
    pread_all(f, p, len, 1);
  } else {
    fprintf(stderr, "unknown mode %d\n", mode);
    return 2;
  }
  const double seconds = now() - start;
  printf("mode %d: %.3f s for %.2f GiB\n", mode, seconds, len / 1073741824.0);
  shm_unlink(name);
  return 0;
}

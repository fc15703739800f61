#include "tdist/detail/comm/engine/peer_memory.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "tdist/error.h"

namespace tdist::detail {

void read_peer_memory(pid_t pid, int peer, uint64_t remote, void* local, size_t bytes,
                      const std::string& description) {
  char* to = static_cast<char*>(local);
  while (bytes > 0) {
    iovec l{to, bytes};
    iovec r{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), bytes};
    const ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : EIO;
      TDIST_THROW(DistBackendError, description + ": reading rank " + std::to_string(peer) +
                                        "'s tensor (process " + std::to_string(pid) +
                                        ") failed: " + std::strerror(err) +
                                        " (did that rank exit or free the tensor mid-op?)");
    }
    to += got;
    remote += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
}

bool can_read_peer_word(pid_t pid, uint64_t address, uint64_t expected) {
  uint64_t word = 0;
  iovec local{&word, sizeof word};
  iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(address)), sizeof word};
  const ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  return got == static_cast<ssize_t>(sizeof word) && word == expected;
}

}  // namespace tdist::detail

#pragma once

// Reads of another process's memory on this host ("cross-memory attach", process_vm_readv):
// how the same-host engine's direct ops read a peer's plain tensor (Note [Plain tensors read
// across processes] in src/mpi/shm_collectives.h). Needs the same user and no ptrace
// restriction; a backend probes that once per group before announcing plain tensors.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace tdist::detail {

/// Copies `bytes` from address `remote` of process `pid` (rank `peer`) into `local`; raises
/// DistBackendError naming `description` (the op), the rank and the system error.
void read_peer_memory(pid_t pid, int peer, uint64_t remote, void* local, size_t bytes,
                      const std::string& description);

/// True when reading 8 bytes at `address` in process `pid` succeeds and yields `expected`.
bool can_read_peer_word(pid_t pid, uint64_t address, uint64_t expected);

}  // namespace tdist::detail

#pragma once

// For engines (gloo, mpi): the internals of symmetric memory (tdist/comm/symmetric_memory.h)
// a same-host collective needs: which of this process's bytes are symmetric, and mappings of
// other processes' allocations.

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include <c10/core/Allocator.h>

namespace tdist::detail {

/// Where a tensor's bytes lie in symmetric memory: allocation `id` (0: not symmetric) at
/// byte `offset`. Ids carry the creating process id in their high half and are never reused.
struct SymmetricRef {
  uint64_t id = 0;
  int64_t offset = 0;
};

/// The allocation of this process holding [ptr, ptr + bytes), if any.
SymmetricRef find_symmetric(const void* ptr, size_t bytes);

/// The shared-memory object name of allocation `id`.
std::string symmetric_name(uint64_t id);

/// Read-only mappings of other processes' symmetric allocations, kept across collectives (a
/// first touch of a mapped page costs a fault; a tensor is usually reduced many times).
/// Mappings of allocations their owner has since freed are dropped when a new one is made.
class SymmetricMappings {
 public:
  SymmetricMappings() = default;
  ~SymmetricMappings();
  SymmetricMappings(const SymmetricMappings&) = delete;
  SymmetricMappings& operator=(const SymmetricMappings&) = delete;

  /// Bytes [offset, offset + bytes) of allocation `id`; throws DistBackendError naming
  /// `owner` (a rank) when the allocation cannot be mapped or is too small.
  const char* map(uint64_t id, int64_t offset, size_t bytes, int self, int owner);

 private:
  struct Mapping {
    char* ptr = nullptr;
    size_t len = 0;
    int fd = -1;
  };
  void drop_freed();
  std::unordered_map<uint64_t, Mapping> maps_;
};

}  // namespace tdist::detail

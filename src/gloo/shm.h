#pragma once

// Same-host shared-memory data path of the Gloo engine (see Note [Shared-memory path]).
//
// Note [Shared-memory path]: when every rank of a group runs on one host (probed at connect:
// every rank maps every other rank's probe segment), all_reduce, all_gather_into_tensor,
// reduce_scatter_tensor, broadcast and even all_to_all_single move their payload through POSIX
// shared memory instead of TCP loopback; only the small per-collective header (which also carries
// the segment names) and, for all_reduce, one "chunk reduced" notification travel over gloo. So the
// cross-rank check, the timeouts and the dead-peer watchdog are those of the TCP path, and a
// mismatch still raises DistBackendError on every rank instead of aborting.
//
// The collectives themselves are the same-host engine's (Note [Same-host collectives] in
// tdist/detail/comm/engine/same_host.h), each one piece: a rank copies what its peers need into its
// segment, announces the segment in the header handshake (its arrival), then reads the peers'
// segments directly; a later phase (all_reduce's "chunk reduced") is a flag notification.
//
// Each rank owns one segment split in two halves; shared-memory collective number m uses half
// m % 2. A rank writes half m % 2 only at the start of collective m; peers read it during
// collective m - 2 at the latest, and their header of collective m - 1 (which this rank has
// received before starting m) proves they are past m - 2. A segment that is too small is
// replaced by a larger one (a new generation with a new name); peers map the new name when
// the header announces it. Names are unlinked once every peer has provably mapped them (its
// header of the next collective). A name announced in the last collective before an arena is
// destroyed may not be mapped by every peer yet (a peer can still be on its way to it while
// this rank returns and exits), so it is left in /dev/shm: names carry the creator's pid, and
// the next arena that connects on this host removes segments of processes that have exited.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tdist/detail/comm/engine/symmetric_registry.h"
#include "tdist/store/store.h"

namespace tdist::detail {

class ShmArena {
 public:
  /// Probes through `store` whether every rank can map every other rank's shared memory.
  /// All ranks get the same answer: an arena, or nullptr (then the TCP path is used).
  /// `max_bytes`: the most its segment may grow to on this rank
  /// (gloo::GlooBackendOptions::shared_memory_max_bytes).
  static std::unique_ptr<ShmArena> connect(Store& store, int rank, int size,
                                           std::chrono::milliseconds timeout, size_t max_bytes);
  ~ShmArena();
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  /// Starts the next shared-memory collective; returns its number (1, 2, ...). Its half is
  /// number % 2.
  uint64_t begin_op() { return ++ops_; }

  /// This rank's half `parity`, at least `bytes` long (grows the segment when needed).
  /// Returns nullptr when the memory cannot be had (/dev/shm full, or the segment would
  /// outgrow TDIST_GLOO_SHM_MAX_BYTES); the caller announces that in its header (key 0) and
  /// every rank moves that collective over TCP.
  char* local(size_t bytes, int parity);
  uint64_t key() const { return key_; }
  uint64_t generation() const { return gen_; }
  /// Why the last local() failed.
  const std::string& last_error() const { return error_; }
  /// Says once per arena on stderr that a collective of `bytes` moved over TCP for lack of
  /// shared memory (Note [Falling back to TCP]).
  void warn_fallback(size_t bytes);

  /// Call once every peer's header of collective `op` has arrived: unlinks the names
  /// announced in earlier collectives (every peer has mapped them).
  void peers_synced(uint64_t op);

  /// Peer p's half `parity` of its segment (key, gen) as announced in its header, at least
  /// `bytes` long; maps it on first use. Throws DistBackendError when it cannot.
  const char* remote(int peer, uint64_t key, uint64_t gen, int parity, size_t bytes);

  // Note [Flag notifications]: a "this rank is past phase X" notification inside a
  // shared-memory collective is a counter in this rank's probe page (mapped by every peer at
  // connect), not a TCP round trip through gloo: arrive() publishes this rank's next number
  // (release) and wakes the peers sleeping on it (a shared futex), flag() reads a peer's
  // (acquire). Every rank runs the same collectives with the same notifications in the same
  // order, so the numbers agree (compared modulo 2^32). Waiters spin only briefly, then sleep
  // on the futex: ranks often outnumber cores, and a spinning waiter would take the core from
  // the very peer it waits for. A rank that never arrives is caught by the waiter's deadline
  // and dead-peer probe (wait_for_notification in same_host_channel.h).
  /// Publishes this rank's next notification; returns its number.
  uint32_t arrive();
  /// `peer`'s latest notification number.
  uint32_t flag(int peer) const;
  /// Sleeps until `peer`'s flag may have moved from `seen`, at most `timeout`.
  void sleep_on(int peer, uint32_t seen, std::chrono::microseconds timeout) const;

  /// Mappings of the peers' symmetric-memory tensors (Note [Symmetric path] in
  /// shm_collectives.cpp).
  SymmetricMappings& symmetric() { return symmetric_; }
  /// Scratch block i (0..2) of the same-host engine's folds, kept across collectives.
  std::vector<char>& scratch(int i) { return scratch_[i]; }

 private:
  ShmArena(int rank, int size, size_t max_bytes);
  struct Mapping {
    uint64_t key = 0;
    uint64_t gen = 0;
    char* ptr = nullptr;
    size_t len = 0;
  };
  struct Announced {
    std::string name;
    uint64_t op;
  };
  static std::string name_of(uint64_t key, uint64_t gen);

  int rank_;
  int size_;
  uint64_t key_;
  uint64_t gen_ = 0;
  uint64_t ops_ = 0;
  Mapping mine_;
  size_t half_ = 0;
  std::vector<Mapping> peers_;
  std::vector<Announced> to_unlink_;
  std::string error_;
  SymmetricMappings symmetric_;
  std::vector<char> scratch_[3];
  char* probe_ = nullptr;                 // this rank's probe page (its flag)
  std::vector<const char*> peer_probes_;  // the peers' probe pages (their flags)
  uint32_t notified_ = 0;
  size_t max_half_;  // shared_memory_max_bytes / 2 (no limit by default)
  bool warned_ = false;
};

}  // namespace tdist::detail

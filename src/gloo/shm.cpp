#include "gloo/shm.h"

#include "tdist/detail/comm/engine/shm_object.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>

#include "tdist/error.h"

namespace tdist::detail {

namespace {

constexpr size_t kProbeBytes = 4096;
// The probe page holds the identity token below this offset and the flag at it.
constexpr size_t kFlagOffset = 2048;
constexpr size_t kAlign = size_t(1) << 20;  // halves grow in whole MiB

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

// The creating process id (high half, for remove_stale_shm_objects) and a random low half.
uint64_t random_key() {
  std::random_device rd;
  return (uint64_t(static_cast<uint32_t>(::getpid())) << 32) | (uint64_t(rd()) | 1);
}

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

std::string ShmArena::name_of(uint64_t key, uint64_t gen) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "/tdist-gloo-%ld-%016llx-%llu", static_cast<long>(key >> 32),
                static_cast<unsigned long long>(key), static_cast<unsigned long long>(gen));
  return buf;
}

ShmArena::ShmArena(int rank, int size, size_t max_bytes)
    : rank_(rank),
      size_(size),
      key_(random_key()),
      peers_(size),
      peer_probes_(size, nullptr),
      max_half_(max_bytes / 2) {}

void ShmArena::warn_fallback(size_t bytes) {
  if (warned_) return;
  warned_ = true;
  std::fprintf(stderr,
               "tdist: rank %d: no shared memory for a %zu-byte collective (%s); it and any "
               "like it move over TCP, slower (free /dev/shm, raise TDIST_GLOO_SHM_MAX_BYTES, or "
               "set TDIST_GLOO_SHM=0 to silence this)\n",
               rank_, bytes, error_.c_str());
}

namespace {
std::atomic<uint32_t>* flag_in(const char* probe) {
  return reinterpret_cast<std::atomic<uint32_t>*>(const_cast<char*>(probe) + kFlagOffset);
}
}  // namespace

uint32_t ShmArena::arrive() {
  const uint32_t number = ++notified_;
  std::atomic<uint32_t>* flag = flag_in(probe_);
  flag->store(number, std::memory_order_release);
  // Shared (not private) futex: the sleepers are other processes.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(flag), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  return number;
}

uint32_t ShmArena::flag(int peer) const {
  return flag_in(peer_probes_[peer])->load(std::memory_order_acquire);
}

void ShmArena::sleep_on(int peer, uint32_t seen, std::chrono::microseconds timeout) const {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000) * 1000;
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(flag_in(peer_probes_[peer])), FUTEX_WAIT, seen,
            &ts, nullptr, 0);
}

namespace {

// Names whose owner was destroyed before every peer had provably mapped them: unlinked by the
// next arena this process connects (by then every peer is long past them), and otherwise by
// remove_stale_segments of any later job once this process has exited. Unlinking them at exit
// would race a slow peer that is about to map them.
std::mutex graveyard_mutex;
std::vector<std::string>& graveyard() {
  static auto* names = new std::vector<std::string>();
  return *names;
}
void empty_graveyard() {
  std::lock_guard<std::mutex> lock(graveyard_mutex);
  for (auto& name : graveyard()) ::shm_unlink(name.c_str());
  graveyard().clear();
}
void bury(std::string name) {
  std::lock_guard<std::mutex> lock(graveyard_mutex);
  graveyard().push_back(std::move(name));
}

}  // namespace

ShmArena::~ShmArena() {
  if (probe_) ::munmap(probe_, kProbeBytes);
  for (const char* p : peer_probes_) {
    if (p) ::munmap(const_cast<char*>(p), kProbeBytes);
  }
  if (mine_.ptr) ::munmap(mine_.ptr, mine_.len);
  for (auto& m : peers_) {
    if (m.ptr) ::munmap(m.ptr, m.len);
  }
  for (auto& a : to_unlink_) bury(a.name);
}

std::unique_ptr<ShmArena> ShmArena::connect(Store& store, int rank, int size,
                                            std::chrono::milliseconds timeout, size_t max_bytes) {
  if (size <= 1) return nullptr;
  empty_graveyard();
  remove_stale_shm_objects();
  std::unique_ptr<ShmArena> arena(new ShmArena(rank, size, max_bytes));
  const std::string probe = name_of(arena->key_, 0);
  const std::string token = "tdist-shm " + std::to_string(arena->key_) + " " + boot_id();
  std::string error;
  char* mine = create_shm_object(probe, kProbeBytes, error);
  if (mine) std::memcpy(mine, token.c_str(), std::min(token.size() + 1, kFlagOffset));
  arena->probe_ = mine;  // kept: its page carries this rank's notification flag
  store.set("gloo/shm/" + std::to_string(rank), mine ? probe + "\n" + token : std::string("-"));
  std::vector<std::string> keys;
  for (int p = 0; p < size; ++p) keys.push_back("gloo/shm/" + std::to_string(p));
  bool ok = mine != nullptr;
  try {
    store.wait(keys, timeout);
    for (int p = 0; p < size && ok; ++p) {
      if (p == rank) continue;
      std::string v = store.get_string(keys[p]);
      auto nl = v.find('\n');
      if (nl == std::string::npos) {
        ok = false;
        break;
      }
      size_t len = 0;
      char* theirs = map_shm_object(v.substr(0, nl), true, &len);  // writable: futex
      if (!theirs) {
        ok = false;
        break;
      }
      ok = len == kProbeBytes && std::strncmp(theirs, v.c_str() + nl + 1, kFlagOffset) == 0;
      if (len == kProbeBytes) {
        arena->peer_probes_[p] = theirs;
      } else {
        ::munmap(theirs, len);
      }
    }
    store.set("gloo/shm_ok/" + std::to_string(rank), std::string(ok ? "1" : "0"));
    std::vector<std::string> oks;
    for (int p = 0; p < size; ++p) oks.push_back("gloo/shm_ok/" + std::to_string(p));
    store.wait(oks, timeout);
    for (int p = 0; p < size && ok; ++p) ok = store.get_string(oks[p]) == "1";
  } catch (...) {
    if (mine) ::shm_unlink(probe.c_str());
    throw;
  }
  // Every peer has mapped it (or given up): the name can go, the pages stay while mapped.
  if (mine) ::shm_unlink(probe.c_str());
  if (!ok) return nullptr;
  return arena;
}

char* ShmArena::local(size_t bytes, int parity) {
  if (bytes > half_ || !mine_.ptr) {
    const size_t half = std::max(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (half > max_half_) {
      error_ = "a segment of 2 x " + std::to_string(half) +
               " bytes would exceed TDIST_GLOO_SHM_MAX_BYTES=" + std::to_string(2 * max_half_);
      return nullptr;
    }
    const std::string name = name_of(key_, gen_ + 1);
    char* p = create_shm_object(name, 2 * half, error_);
    if (!p) return nullptr;
    // Peers keep their own mapping of the previous generation (and its name stays in
    // to_unlink_ until they have mapped it), so dropping ours is safe.
    if (mine_.ptr) ::munmap(mine_.ptr, mine_.len);
    ++gen_;
    mine_ = {key_, gen_, p, 2 * half};
    half_ = half;
    // Announced in this collective; unlinked once every peer has passed it.
    to_unlink_.push_back({name, ops_});
  }
  return mine_.ptr + parity * half_;
}

void ShmArena::peers_synced(uint64_t op) {
  // Every peer's header of collective `op` shows it finished collective op - 1, where it
  // mapped whatever this rank announced up to then.
  size_t kept = 0;
  for (auto& a : to_unlink_) {
    if (a.op < op) {
      ::shm_unlink(a.name.c_str());
    } else {
      to_unlink_[kept++] = a;
    }
  }
  to_unlink_.resize(kept);
}

const char* ShmArena::remote(int peer, uint64_t key, uint64_t gen, int parity, size_t bytes) {
  Mapping& m = peers_[peer];
  if (m.key != key || m.gen != gen || !m.ptr) {
    if (m.ptr) ::munmap(m.ptr, m.len);
    m = Mapping{};
    size_t len = 0;
    char* p = map_shm_object(name_of(key, gen), false, &len);
    if (!p) {
      TDIST_THROW(DistBackendError,
                  "rank " + std::to_string(rank_) + ": gloo cannot map the shared memory of rank " +
                      std::to_string(peer) + " (" + name_of(key, gen) + "): " + errno_text() +
                      "; set TDIST_GLOO_SHM=0 to use TCP only");
    }
    m = {key, gen, p, len};
  }
  const size_t half = m.len / 2;
  if (bytes > half) {
    TDIST_THROW(DistBackendError, "rank " + std::to_string(rank_) + ": the shared memory of rank " +
                                      std::to_string(peer) + " holds " + std::to_string(half) +
                                      " bytes but " + std::to_string(bytes) +
                                      " are needed (ranks disagree on the size)");
  }
  return m.ptr + parity * half;
}

}  // namespace tdist::detail

#include "gloo/same_host_channel.h"

#include <algorithm>

#include "gloo/collective_common.h"
#include "tdist/detail/comm/engine/cpu_relax.h"
#include "tdist/error.h"

namespace tdist::detail {

GlooSameHostChannel::GlooSameHostChannel(Exchange& ex, ShmArena& arena, Header header,
                                         std::vector<int64_t> send, std::vector<int64_t> recv)
    : ex_(ex),
      arena_(arena),
      header_(header),
      send_(std::move(send)),
      recv_(std::move(recv)),
      halves_(static_cast<size_t>(ex.size()), nullptr) {}

char* GlooSameHostChannel::my_half(uint64_t seq, size_t bytes) {
  mine_ = arena_.local(bytes, static_cast<int>(seq % 2));
  return mine_;
}

// Note [Falling back to TCP]: a rank that cannot get a large enough segment (/dev/shm full, as
// with Docker's default 64 MiB, or over TDIST_GLOO_SHM_MAX_BYTES) announces key 0 in its
// header. Every rank sees every header, so all of them agree to move this collective's data
// over TCP instead (the handshake is done; the caller runs the TCP algorithm), and later
// collectives try shared memory again. The rank that lacked memory says so once on stderr.
bool GlooSameHostChannel::arrive(uint64_t seq, const PieceAnnouncement& mine,
                                 const std::vector<size_t>& staged) {
  const int n = ex_.size();
  const int r = ex_.rank();
  Header header = header_;
  if (mine.direct) {
    header.sym_id = mine.symmetric.id;
    header.sym_offset = mine.symmetric.offset;
  } else if (mine_ != nullptr) {
    header.shm_key = arena_.key();
    header.shm_gen = arena_.generation();
  }
  headers_ = ex_.handshake(header, send_, recv_);
  arena_.peers_synced(seq);
  check_symmetric_agreement(mine.direct);
  if (mine.direct) return true;
  for (int p = 0; p < n; ++p) {
    if (headers_[p].shm_key != 0) continue;
    if (p == r) arena_.warn_fallback(staged[static_cast<size_t>(p)]);
    return false;
  }
  // Every announced segment is mapped now, even one this collective does not read: its owner
  // unlinks the name once this rank's next header arrives (ShmArena::peers_synced).
  const int parity = static_cast<int>(seq % 2);
  for (int p = 0; p < n; ++p) {
    halves_[p] = p == r ? mine_
                        : arena_.remote(p, headers_[p].shm_key, headers_[p].shm_gen, parity,
                                        staged[static_cast<size_t>(p)]);
  }
  return true;
}

// Raises DistBackendError on every rank when some ranks announced a symmetric tensor and
// others did not (every rank sees every header, so all of them raise).
void GlooSameHostChannel::check_symmetric_agreement(bool mine) const {
  for (int p = 0; p < ex_.size(); ++p) {
    if ((headers_[p].sym_id != 0) == mine) continue;
    const int sym = mine ? ex_.rank() : p;
    const int plain = mine ? p : ex_.rank();
    TDIST_THROW(DistBackendError,
                rank_prefix(ex_.rank(), ex_.info().op) + "rank " + std::to_string(sym) +
                    " passed a tensor in symmetric memory and rank " + std::to_string(plain) +
                    " did not: pass contiguous symmetric-memory tensors of the reduction's dtype "
                    "(tdist::symmetric_memory::empty) on every rank, or on none");
  }
}

// Every rank makes the same notifications in the same order, so "peer's phase of this piece"
// is "peer's notification with the number of my latest".
void GlooSameHostChannel::signal(PiecePhase, uint64_t) {
  notification_ = arena_.arrive();
}

bool GlooSameHostChannel::wait(int peer, PiecePhase phase, uint64_t, const char*) {
  // Arrival is the handshake: every header is in once arrive() returns.
  if (phase != PiecePhase::kArrived) wait_for_notification(ex_, arena_, peer, notification_);
  return true;
}

PieceAnnouncement GlooSameHostChannel::announcement(int peer, uint64_t) const {
  const Header& h = headers_[static_cast<size_t>(peer)];
  PieceAnnouncement a;
  a.direct = h.sym_id != 0;
  a.symmetric = {h.sym_id, h.sym_offset};
  return a;
}

void GlooSameHostChannel::read_peer(int peer, uint64_t, void*, size_t) {
  TDIST_THROW(DistBackendError, describe() + ": rank " + std::to_string(peer) +
                                    "'s plain memory cannot be read (the gloo engine reads only "
                                    "symmetric memory)");
}

std::string GlooSameHostChannel::describe() const {
  return "rank " + std::to_string(ex_.rank()) + ": gloo " + ex_.info().op;
}

namespace {

// Whether notification `flag` is at or past `number` (modulo 2^32).
bool reached(uint32_t flag, uint32_t number) {
  return static_cast<int32_t>(flag - number) >= 0;
}

// tdistrun reads "waiting for rank N ...: lost the connection to it" (Note [Blaming the lost
// peer] in src/launch/failure_cause.h).
[[noreturn]] void raise_lost_peer(const std::string& what, const std::exception_ptr& error) {
  const std::string why = message_of(error, "connection failed");
  TDIST_THROW(NetworkError, what +
                                "lost the connection to it (the peer died or closed the group); "
                                "the group is now broken: " +
                                why);
}

}  // namespace

// A short spin (the peer is usually there already), then sleeping on its flag (Note [Flag
// notifications]), against the collective's deadline and with the dead-peer probe every
// 100 ms.
void wait_for_notification(Exchange& ex, ShmArena& arena, int peer, uint32_t number) {
  for (int i = 0; i < 256; ++i) {
    if (reached(arena.flag(peer), number)) return;
    cpu_relax();
  }
  auto next_probe = Clock::now() + std::chrono::milliseconds(100);
  for (;;) {
    const uint32_t seen = arena.flag(peer);
    if (reached(seen, number)) return;
    const auto now = Clock::now();
    auto what = [&] {
      return rank_prefix(ex.rank(), ex.info().op) + "#" + std::to_string(ex.info().seq) +
             " waiting for rank " + std::to_string(peer) + " in shared memory: ";
    };
    if (now >= ex.info().deadline) {
      TDIST_THROW(TimeoutError, what() + "timed out after " +
                                    std::to_string(ex.info().timeout.count()) +
                                    " ms (is it stopped, hung or running other collectives?); "
                                    "the group is now broken");
    }
    if (now >= next_probe) {
      if (std::exception_ptr error = ex.comm().peer_error(peer)) raise_lost_peer(what(), error);
      next_probe = now + std::chrono::milliseconds(100);
    }
    const auto until = std::min(next_probe, ex.info().deadline);
    arena.sleep_on(peer, seen,
                   std::chrono::duration_cast<std::chrono::microseconds>(until - now) +
                       std::chrono::microseconds(1));
  }
}

}  // namespace tdist::detail

#pragma once

// One collective's traffic: posts sends/recvs on gloo unbound buffers under slots unique to
// this collective, waits on them against the collective's deadline, and turns gloo's
// errors into tdist errors that name the rank, the op, its sequence number and the peer.
// Also the header handshake that checks that all ranks run the same collective
// (see Note [Header handshake]).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gloo/gloo_comm.h"

namespace tdist::detail {

using Clock = std::chrono::steady_clock;

/// What a collective is, for error messages and the cross-rank check.
struct OpInfo {
  std::string op;  // "all_reduce", ...
  uint64_t seq = 0;
  std::chrono::milliseconds timeout{0};
  Clock::time_point deadline;
};

// Note [Header handshake]: before any payload moves, every rank sends every peer a fixed-size
// header on a fixed slot (op, sequence number, dtype, reduce op, root, total elements, and
// the bytes it will send to / expects from that peer), and checks the headers it gets.
// libgloo aborts the process when a payload is larger than the posted receive, so payloads
// are only posted once sizes agree; a mismatch becomes a DistBackendError naming both sides.
struct Header {
  uint64_t magic = 0;
  uint64_t seq = 0;
  int32_t op = 0;
  int32_t dtype = -1;
  int32_t reduce_op = -1;
  int32_t root = -1;
  int64_t total = 0;       // elements (or another size every rank agrees on)
  int64_t send_bytes = 0;  // bytes the sender sends to the receiver
  int64_t recv_bytes = 0;  // bytes the sender expects from the receiver
  uint64_t shm_key = 0;    // shared-memory path: the sender's segment (0: it has none)
  uint64_t shm_gen = 0;
  uint64_t sym_id = 0;  // symmetric-memory path: the sender's tensor (0: not symmetric)
  int64_t sym_offset = 0;
};

/// Short description of a header for messages: "all_reduce(total=10, dtype=Float, op=SUM)".
std::string describe(const Header& header);

class Exchange {
 public:
  Exchange(GlooComm& comm, OpInfo info);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  const OpInfo& info() const { return info_; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  GlooComm& comm() { return comm_; }

  /// Header handshake with every peer. `send_bytes[p]`/`recv_bytes[p]` are this rank's
  /// payload sizes towards/from p (ignored for p == rank). Returns every rank's header
  /// (this rank's own at index rank).
  std::vector<Header> handshake(Header mine, const std::vector<int64_t>& send_bytes,
                                const std::vector<int64_t>& recv_bytes);

  /// Posts one message; `key` (< 2^32) must be unique per direction within this collective.
  /// Returns a handle for wait().
  size_t post_send(int peer, const void* ptr, size_t bytes, uint64_t key, int channel);
  size_t post_recv(int peer, void* ptr, size_t bytes, uint64_t key, int channel);
  /// A receive from whichever of `peers` sends first; source() names it once waited for.
  size_t post_recv_any(const std::vector<int>& peers, void* ptr, size_t bytes, uint64_t key,
                       int channel);
  void wait(size_t handle);
  /// The rank a waited-for receive came from.
  int source(size_t handle) const;
  /// Waits for every posted message not yet waited for.
  void wait_all();

  /// Splits a transfer into segments spread over the channels; keys key_base + segment.
  void send_segmented(int peer, const void* ptr, size_t bytes, uint64_t key_base);
  void recv_segmented(int peer, void* ptr, size_t bytes, uint64_t key_base);

  /// Peer-to-peer slots use tag-derived slots instead of the sequence number.
  void set_slot_base(uint64_t base) { slot_base_ = base; }

 private:
  struct Pending;
  [[noreturn]] void rethrow(int peer, bool is_send);

  GlooComm& comm_;
  OpInfo info_;
  uint64_t slot_base_;
  std::vector<std::unique_ptr<Pending>> pending_;
};

}  // namespace tdist::detail

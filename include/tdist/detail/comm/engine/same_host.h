#pragma once

// The same-host collective engine every CPU backend runs its shared-memory collectives on
// (Note [Same-host collectives]).
//
// Note [Same-host collectives]: when every rank of a group shares one host, a collective's
// payload moves through memory the ranks map instead of messages. One SameHostOp per
// collective runs it as consecutive pieces, each a small state machine over three points a
// rank publishes and its peers wait for (PiecePhase):
//
//   staged (each rank copies what peers need into its half of a staging segment):
//     all_reduce:     the chunks j != r of the piece into my half; arrive; chunk r of every
//                     rank folded in rank order into my own chunk's slot of my half (and my
//                     tensor); reduced; every peer's reduced chunk copied out of its half.
//     reduce_scatter: the blocks j != r into my half; arrive; my output = block r of every
//                     rank, folded in rank order.
//     all_gather:     my input into my half; arrive; each rank's half into its block.
//     broadcast:      the root's tensor into its half; arrive; the root's half copied out.
//     all_to_all:     the blocks j != r into my half; arrive; block r of each rank's half.
//   direct (peers read each other's tensors where they lie: symmetric memory mapped by the
//   reader, or plain memory read across processes when the channel allows it), one piece:
//     all_gather:     arrive announcing my input (or my block of the output, filled first);
//                     copy each rank's announced block; reduced.
//     reduce_scatter: arrive; block r of every rank's input folded in rank order; reduced.
//     all_reduce:     arrive; chunk r of every rank's tensor folded into mine; reduced; each
//                     rank k's chunk k copied from its tensor; copied.
//     A direct op waits for every peer's last phase, so no peer reads a rank's tensor after
//     that rank returns.
//
// Every element of a reduction is computed by one rank, in rank order, and copied to the
// others, so all ranks get bitwise-equal results, equal to a left fold over ranks. Folds run
// in cache-sized blocks (64 KiB staged, 256 KiB direct) on the caller's fold function.
//
// A staging half is reused two pieces later: a rank writes half (s % 2) at piece s only after
// finishing piece s - 1, which needed every peer's arrival at s - 1, which each peer makes only
// after finishing piece s - 2 (all its reads of that half). So the pieces of one group must
// run one at a time, in issue order.
//
// What differs between backends is the SameHostChannel: where the staging halves live and how
// large a piece is, how a rank announces its part (a header over the backend's transport, or
// a slot in its segment), and how it waits (sleeping on a futex until done, or spinning
// briefly and handing the thread back to an executor that polls again).

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdist/comm/collective_backend.h"
#include "tdist/detail/comm/engine/symmetric_registry.h"

namespace tdist::detail {

/// What a rank tells its peers about its part of one piece, besides its staged half.
struct PieceAnnouncement {
  bool direct = false;     ///< peers read my tensor (else my half is staged)
  SymmetricRef symmetric;  ///< where my tensor lies in symmetric memory (id 0: plain memory)
  uint64_t address = 0;    ///< my tensor's address in my process (plain direct reads)
};

/// The points of a piece a rank publishes and its peers wait for.
enum class PiecePhase {
  kArrived,  ///< my part is staged or announced (published by SameHostChannel::arrive)
  kReduced,  ///< my reduced chunk is published; a direct op: I have read my peers
  kCopied,   ///< a direct all_reduce: I have copied my peers' reduced chunks
};

/// What a backend gives the engine: staging memory, announcements, flags and how to wait.
class SameHostChannel {
 public:
  virtual ~SameHostChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// The most bytes one rank stages per piece; larger ops run as consecutive pieces.
  virtual int64_t piece_bytes() const = 0;
  /// Whether an op with no elements still runs one empty piece (its announcement carries a
  /// cross-rank check) instead of returning at once.
  virtual bool runs_empty_ops() const = 0;
  /// Whether peers read each other's plain tensors directly in an op of `op_bytes` (the larger
  /// of input and output).
  virtual bool reads_plain_tensors(int64_t op_bytes, bool all_reduce) const = 0;
  /// Whether arrive() waits for every peer's arrival (then a rank does its own part of a
  /// piece before arriving, while it would wait anyway; else after, while peers read).
  virtual bool arrival_blocks() const = 0;
  /// The next piece's sequence number, the same on every rank.
  virtual uint64_t take_seq() = 0;
  /// My staging half for piece `seq`, at least `bytes` long; null when none can be had
  /// (arrive then reports that the op falls back).
  virtual char* my_half(uint64_t seq, size_t bytes) = 0;
  /// Publishes my part of piece `seq` (its half filled, or `mine` announcing my tensor).
  /// `staged[p]`: the bytes rank p staged. False when some rank could not stage: the op moves
  /// nothing, and the backend moves it over its own transport.
  virtual bool arrive(uint64_t seq, const PieceAnnouncement& mine,
                      const std::vector<size_t>& staged) = 0;
  /// Publishes that I have passed `phase` (kReduced, kCopied) of piece `seq`.
  virtual void signal(PiecePhase phase, uint64_t seq) = 0;
  /// True once `peer` has published `phase` of piece `seq`; false when it has not yet and the
  /// caller should return to its executor (a blocking channel waits instead). Raises past the
  /// op's deadline or when the peer is gone; `what` says what the peer has not done.
  virtual bool wait(int peer, PiecePhase phase, uint64_t seq, const char* what) = 0;
  /// `peer`'s announcement of piece `seq` (after its arrival).
  virtual PieceAnnouncement announcement(int peer, uint64_t seq) const = 0;
  /// `peer`'s staged half of piece `seq` (after its arrival); my own for peer == rank().
  virtual const char* peer_half(int peer, uint64_t seq) const = 0;
  /// Mappings of the peers' symmetric allocations, kept across ops.
  virtual SymmetricMappings& symmetric_mappings() = 0;
  /// Copies `bytes` at `address` in `peer`'s process into `dst` (reads_plain_tensors).
  virtual void read_peer(int peer, uint64_t address, void* dst, size_t bytes) = 0;
  /// Scratch block i (0..2) of the folds, kept across ops (a fresh one would fault its pages in).
  virtual std::vector<char>& scratch(int i) = 0;
  /// The op for messages: "rank 0: gloo all_reduce" or "mpi: rank 0: all_reduce".
  virtual std::string describe() const = 0;
};

/// dst = a (op) b over `count` elements; dst may alias a or b.
using FoldFn = std::function<void(void* dst, const void* a, const void* b, size_t count)>;
/// Applied to every fully folded element once (AVG's division where the caller wants it).
using FinishFn = std::function<void(void* ptr, size_t count)>;

/// `numel` contiguous elements of `element_size` bytes at `data`.
struct ElementSpan {
  void* data = nullptr;
  int64_t numel = 0;
  size_t element_size = 1;
  size_t bytes() const { return static_cast<size_t>(numel) * element_size; }
};

/// A contiguous tensor's elements.
inline ElementSpan span_of(const at::Tensor& t) {
  return {t.data_ptr(), t.numel(), static_cast<size_t>(t.element_size())};
}

/// One collective over a SameHostChannel, on contiguous memory in the dtype the op moves
/// (reductions: the dtype they accumulate in). Works on raw memory: an op costs no ATen call.
class SameHostOp {
 public:
  using BlockPlacer = CollectiveBackend::BlockPlacer;

  /// `buffer` reduced over every rank in place.
  static std::unique_ptr<SameHostOp> all_reduce(SameHostChannel& channel, ElementSpan buffer,
                                                FoldFn fold, FinishFn finish = nullptr);
  /// `out` (numel x size == in.numel) = block rank of every rank's `in`, reduced.
  static std::unique_ptr<SameHostOp> reduce_scatter(SameHostChannel& channel, ElementSpan in,
                                                    ElementSpan out, FoldFn fold,
                                                    FinishFn finish = nullptr);
  /// `out` (numel == in.numel x size) = every rank's `in`, in rank order.
  static std::unique_ptr<SameHostOp> all_gather(SameHostChannel& channel, ElementSpan in,
                                                ElementSpan out);
  /// Note [Placed all-gather] (tdist/detail/comm/placed_all_gather.h): place(c, block) for every
  /// rank c's `in`, once each, before the op finishes.
  static std::unique_ptr<SameHostOp> all_gather_placed(SameHostChannel& channel, ElementSpan in,
                                                       BlockPlacer place);
  /// The root's `buffer` to every rank.
  static std::unique_ptr<SameHostOp> broadcast(SameHostChannel& channel, ElementSpan buffer,
                                               int root);
  /// Block p of `in` to rank p; block c of `out` from rank c (even splits).
  static std::unique_ptr<SameHostOp> all_to_all(SameHostChannel& channel, ElementSpan in,
                                                ElementSpan out);

  virtual ~SameHostOp() = default;
  /// Runs stages until the op has finished (true) or waits on a peer (false: call again);
  /// sets `progressed` when it did some work.
  virtual bool advance(bool& progressed) = 0;
  /// Advances until finished (a blocking channel never returns false in between).
  void run() {
    bool progressed = false;
    while (!advance(progressed)) {
    }
  }
  /// Whether the finished op moved nothing because some rank could not stage.
  virtual bool fell_back() const = 0;
};

}  // namespace tdist::detail

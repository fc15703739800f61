#pragma once

// The Gloo engine's channel to the same-host engine (tdist/detail/comm/engine/same_host.h): one per
// collective. Staging halves are the arena's growable segments, so every op is one piece; a
// rank arrives by the header handshake, which announces its segment (or its symmetric tensor)
// and carries the cross-rank check; later phases are futex-backed flags in the probe pages
// (Note [Flag notifications] in shm.h), waited for blocking, against the collective's deadline
// and with the dead-peer probe.

#include <cstdint>
#include <string>
#include <vector>

#include "gloo/exchange.h"
#include "gloo/shm.h"
#include "tdist/detail/comm/engine/same_host.h"

namespace tdist::detail {

class GlooSameHostChannel final : public SameHostChannel {
 public:
  /// `header`: this collective's handshake header (op, dtype, sizes); `send`/`recv`: per-peer
  /// payload bytes for the handshake's pairwise check (all_to_all), else empty.
  GlooSameHostChannel(Exchange& ex, ShmArena& arena, Header header, std::vector<int64_t> send = {},
                      std::vector<int64_t> recv = {});

  int rank() const override { return ex_.rank(); }
  int size() const override { return ex_.size(); }
  int64_t piece_bytes() const override { return INT64_MAX; }
  bool runs_empty_ops() const override { return true; }
  bool reads_plain_tensors(int64_t, bool) const override { return false; }
  bool arrival_blocks() const override { return true; }
  uint64_t take_seq() override { return arena_.begin_op(); }
  char* my_half(uint64_t seq, size_t bytes) override;
  bool arrive(uint64_t seq, const PieceAnnouncement& mine,
              const std::vector<size_t>& staged) override;
  void signal(PiecePhase phase, uint64_t seq) override;
  bool wait(int peer, PiecePhase phase, uint64_t seq, const char* what) override;
  PieceAnnouncement announcement(int peer, uint64_t seq) const override;
  const char* peer_half(int peer, uint64_t) const override {
    return halves_[static_cast<size_t>(peer)];
  }
  SymmetricMappings& symmetric_mappings() override { return arena_.symmetric(); }
  void read_peer(int peer, uint64_t address, void* dst, size_t bytes) override;
  std::vector<char>& scratch(int i) override { return arena_.scratch(i); }
  std::string describe() const override;

 private:
  void check_symmetric_agreement(bool mine) const;

  Exchange& ex_;
  ShmArena& arena_;
  Header header_;
  std::vector<int64_t> send_, recv_;
  char* mine_ = nullptr;
  std::vector<Header> headers_;
  std::vector<const char*> halves_;
  uint32_t notification_ = 0;  // the number of my latest flag notification
};

/// Waits until every peer has made the notification this rank has just made (`number`).
void wait_for_notification(Exchange& ex, ShmArena& arena, int peer, uint32_t number);

}  // namespace tdist::detail

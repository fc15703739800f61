#include "gloo/exchange.h"

#include <algorithm>
#include <array>

#include <c10/core/ScalarType.h>

#include "tdist/comm/types.h"
#include "tdist/detail/comm/engine/op_codes.h"
#include "tdist/error.h"

namespace tdist::detail {

namespace {

constexpr uint64_t kMagic = 0x7464697374676c6fULL;  // "tdistglo"
constexpr uint64_t kHeaderSlot = 1;

std::string peer_name(int peer) {
  return peer < 0 ? std::string("any rank") : "rank " + std::to_string(peer);
}

}  // namespace

std::string describe(const Header& h) {
  const char* name = collective_op_name(h.op);
  std::string op = name ? name : "?";
  std::string s = op + " #" + std::to_string(h.seq) + "(elements=" + std::to_string(h.total);
  if (h.dtype >= 0)
    s += ", dtype=" + std::string(c10::toString(static_cast<at::ScalarType>(h.dtype)));
  if (h.reduce_op >= 0)
    s += ", op=" + to_string(ReduceOp(static_cast<ReduceOp::Kind>(h.reduce_op)));
  if (h.root >= 0) s += ", root=" + std::to_string(h.root);
  return s + ")";
}

struct Exchange::Pending {
  std::unique_ptr<gloo_transport::Buffer> buffer;
  int peer = -1;  // -1: a receive from any of several peers
  int source = -1;
  bool is_send = false;
  bool done = false;
};

Exchange::Exchange(GlooComm& comm, OpInfo info)
    : comm_(comm), info_(std::move(info)), slot_base_(info_.seq << 32) {}

Exchange::~Exchange() = default;

void Exchange::rethrow(int peer, bool is_send) {
  const std::string what = "rank " + std::to_string(rank()) + ": gloo " + info_.op + " #" +
                           std::to_string(info_.seq) + " (" +
                           (is_send ? "sending to " : "receiving from ") + peer_name(peer) + ")";
  try {
    throw;
  } catch (const tdist::Error&) {
    throw;
  } catch (const std::exception& e) {
    const bool timed_out = Clock::now() + std::chrono::milliseconds(20) >= info_.deadline ||
                           std::string(e.what()).find("Timed out") != std::string::npos;
    if (timed_out) {
      TDIST_THROW(TimeoutError, what + " timed out after " + std::to_string(info_.timeout.count()) +
                                    " ms waiting for " + peer_name(peer) +
                                    " (is it stopped, hung or running other collectives?); the "
                                    "group is now broken: " +
                                    e.what());
    }
    // tdistrun reads "lost the connection to rank N" (Note [Blaming the lost peer]).
    TDIST_THROW(NetworkError, what + ": lost the connection to " + peer_name(peer) +
                                  " (the peer died or closed the group); the group is now "
                                  "broken: " +
                                  e.what());
  }
}

size_t Exchange::post_send(int peer, const void* ptr, size_t bytes, uint64_t key, int channel) {
  auto p = std::make_unique<Pending>();
  p->peer = peer;
  p->is_send = true;
  try {
    p->buffer = comm_.buffer(channel, const_cast<void*>(ptr), bytes);
    p->buffer->send(peer, slot_base_ | key, 0, bytes);
  } catch (...) {
    rethrow(peer, true);
  }
  pending_.push_back(std::move(p));
  return pending_.size() - 1;
}

size_t Exchange::post_recv(int peer, void* ptr, size_t bytes, uint64_t key, int channel) {
  auto p = std::make_unique<Pending>();
  p->peer = peer;
  try {
    p->buffer = comm_.buffer(channel, ptr, bytes);
    p->buffer->recv(peer, slot_base_ | key, 0, bytes);
  } catch (...) {
    rethrow(peer, false);
  }
  pending_.push_back(std::move(p));
  return pending_.size() - 1;
}

size_t Exchange::post_recv_any(const std::vector<int>& peers, void* ptr, size_t bytes, uint64_t key,
                               int channel) {
  auto p = std::make_unique<Pending>();
  try {
    p->buffer = comm_.buffer(channel, ptr, bytes);
    p->buffer->recv_any(peers, slot_base_ | key, 0, bytes);
  } catch (...) {
    rethrow(-1, false);
  }
  pending_.push_back(std::move(p));
  return pending_.size() - 1;
}

int Exchange::source(size_t handle) const {
  return pending_[handle]->source;
}

void Exchange::wait(size_t handle) {
  Pending& p = *pending_[handle];
  if (p.done) return;
  bool ok = false;
  GlooComm::Waiter waiter;
  waiter.buffer = p.buffer.get();
  waiter.peer = p.peer;
  waiter.is_send = p.is_send;
  comm_.watch(&waiter);
  try {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(info_.deadline - Clock::now());
    left = std::max(left, std::chrono::milliseconds(1));
    p.source = p.peer;
    ok = p.is_send ? p.buffer->wait_send(left) : p.buffer->wait_recv(left, &p.source);
  } catch (...) {
    comm_.unwatch(&waiter);
    rethrow(p.peer, p.is_send);
  }
  comm_.unwatch(&waiter);
  if (!ok) {
    // Aborted by the watchdog: the connection to the peer failed mid-transfer.
    const std::string cause = message_of(comm_.peer_error(p.peer), "aborted");
    TDIST_THROW(NetworkError, "rank " + std::to_string(rank()) + ": gloo " + info_.op + " #" +
                                  std::to_string(info_.seq) + " (" +
                                  (p.is_send ? "sending to " : "receiving from ") +
                                  peer_name(p.peer) + "): lost the connection to " +
                                  peer_name(p.peer) +
                                  " (the peer died or closed the group); the group is now "
                                  "broken: " +
                                  cause);
  }
  p.done = true;
}

void Exchange::wait_all() {
  for (size_t i = 0; i < pending_.size(); ++i) wait(i);
}

void Exchange::send_segmented(int peer, const void* ptr, size_t bytes, uint64_t key_base) {
  const size_t seg = comm_.segment_bytes();
  const char* p = static_cast<const char*>(ptr);
  size_t k = 0;
  for (size_t off = 0; off < bytes || (bytes == 0 && k == 0); off += seg, ++k) {
    post_send(peer, p + off, std::min(seg, bytes - off), key_base + k,
              static_cast<int>(k % comm_.channels()));
    if (bytes == 0) break;
  }
}

void Exchange::recv_segmented(int peer, void* ptr, size_t bytes, uint64_t key_base) {
  const size_t seg = comm_.segment_bytes();
  char* p = static_cast<char*>(ptr);
  size_t k = 0;
  for (size_t off = 0; off < bytes || (bytes == 0 && k == 0); off += seg, ++k) {
    post_recv(peer, p + off, std::min(seg, bytes - off), key_base + k,
              static_cast<int>(k % comm_.channels()));
    if (bytes == 0) break;
  }
}

std::vector<Header> Exchange::handshake(Header mine, const std::vector<int64_t>& send_bytes,
                                        const std::vector<int64_t>& recv_bytes) {
  const int n = size();
  if (n == 1) return {mine};
  mine.magic = kMagic;
  mine.seq = info_.seq;
  mine.op = collective_op_code(info_.op);
  std::vector<Header> out(n, mine), in(n);
  const uint64_t saved = slot_base_;
  slot_base_ = 0;
  std::vector<size_t> recvs(n), sends(n);
  for (int p = 0; p < n; ++p) {
    if (p == rank()) continue;
    out[p].send_bytes = send_bytes.empty() ? 0 : send_bytes[p];
    out[p].recv_bytes = recv_bytes.empty() ? 0 : recv_bytes[p];
    recvs[p] = post_recv(p, &in[p], sizeof(Header), kHeaderSlot, 0);
  }
  for (int p = 0; p < n; ++p) {
    if (p != rank()) sends[p] = post_send(p, &out[p], sizeof(Header), kHeaderSlot, 0);
  }
  slot_base_ = saved;
  // Both directions complete before any check, so that a rank that raises a mismatch has
  // delivered its own header and its peers raise too instead of timing out.
  for (int p = 0; p < n; ++p) {
    if (p != rank()) wait(recvs[p]);
  }
  for (int p = 0; p < n; ++p) {
    if (p != rank()) wait(sends[p]);
  }
  std::string mismatch;
  for (int p = 0; p < n; ++p) {
    if (p == rank()) continue;
    const Header& h = in[p];
    const std::string who = "rank " + std::to_string(rank()) + " runs " + describe(mine) +
                            " but rank " + std::to_string(p) + " runs " + describe(h);
    if (h.magic != kMagic) {
      mismatch =
          "rank " + std::to_string(rank()) + " got a corrupt header from rank " + std::to_string(p);
    } else if (h.op != mine.op || h.seq != mine.seq || h.dtype != mine.dtype ||
               h.reduce_op != mine.reduce_op || h.root != mine.root || h.total != mine.total) {
      mismatch = who;
    } else if (h.send_bytes != out[p].recv_bytes || h.recv_bytes != out[p].send_bytes) {
      mismatch = who + ": rank " + std::to_string(p) + " sends " + std::to_string(h.send_bytes) +
                 " bytes to rank " + std::to_string(rank()) + " which expects " +
                 std::to_string(out[p].recv_bytes) + ", and expects " +
                 std::to_string(h.recv_bytes) + " bytes where rank " + std::to_string(rank()) +
                 " sends " + std::to_string(out[p].send_bytes);
    }
    if (!mismatch.empty()) break;
  }
  if (!mismatch.empty()) {
    TDIST_THROW(DistBackendError,
                "gloo collective mismatch: " + mismatch +
                    "; every rank must call the same collectives in the same order with "
                    "matching dtypes, sizes, ops and roots");
  }
  in[rank()] = mine;
  return in;
}

}  // namespace tdist::detail

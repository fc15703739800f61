#pragma once

// The Gloo collective engine: every collective of CollectiveBackend on CPU tensors, built on
// libgloo's TCP transport (pairs + unbound buffers) with our own algorithms (ring
// reduce-scatter / all-gather, pipelined chain broadcast, direct exchanges).
//
// Every call validates its arguments at once (InvalidArgument) and returns a Work at once;
// the collective runs on the backend's worker thread in issue order (send and recv each have
// their own thread so that isend/irecv pairs never deadlock). Before any data moves, the
// ranks exchange a small header (op, sequence number, dtype, sizes) so that a mismatch across
// ranks raises DistBackendError on the ranks that see it instead of hanging or aborting.
// A dead peer raises NetworkError naming it; a silent peer raises TimeoutError after the
// timeout. Either failure marks the backend broken: later calls fail at once.

#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tdist/arg.h"
#include "tdist/comm/collective_backend.h"
#include "tdist/store/store.h"

namespace tdist::detail {
class GlooComm;
class GlooWorkQueue;
}  // namespace tdist::detail

namespace tdist::gloo {

struct GlooBackendOptions {
  /// Network interfaces to use (GLOO_SOCKET_IFNAME, comma separated). Channels are spread
  /// round-robin over the interfaces.
  TDIST_ARG(std::vector<std::string>, interfaces);
  /// Host name or address to bind when no interface is given (empty: as below).
  TDIST_ARG(std::string, hostname);
  /// The store's host (MASTER_ADDR): with no interface or hostname given, gloo binds the
  /// local address that routes to it (docs/gloo.md "Which address gloo binds").
  TDIST_ARG(std::string, store_host);
  /// Whether every rank runs on this host (LOCAL_WORLD_SIZE == WORLD_SIZE), if known: then
  /// loopback is a usable fallback; on several hosts it is an error.
  TDIST_ARG(std::optional<bool>, single_host);
  /// TORCH_GLOO_LAZY_INIT: connect on the first collective instead of in the constructor.
  /// Debian's libgloo (2022) has no per-pair lazy connect, so the whole mesh is connected
  /// then; every rank must issue a collective (or send/recv) for that to finish.
  TDIST_ARG(bool, lazy_init) = false;
  /// Parallel TCP connections per peer (each with its own gloo device and I/O thread);
  /// large transfers are split in segments spread over them.
  TDIST_ARG(int, channels) = 2;
  /// Bytes per pipelined segment of the large-message algorithms.
  TDIST_ARG(size_t, segment_bytes) = size_t(1) << 20;
  /// When every rank of the group is on this host (probed at connect), all_reduce,
  /// all_gather_into_tensor, reduce_scatter_tensor, broadcast and even-split
  /// all_to_all_single move their data through POSIX shared memory; only headers and
  /// notifications go over TCP, so checks, timeouts and dead-peer detection are the TCP
  /// path's. On by default; TDIST_GLOO_SHM=0 turns it off (docs/gloo.md).
  TDIST_ARG(bool, shared_memory) = true;
  /// TDIST_GLOO_SHM_MAX_BYTES: the most shared memory one group's staging segment may take on
  /// this rank (no limit by default); larger collectives move over TCP (Note [Falling back to
  /// TCP]).
  TDIST_ARG(size_t, shared_memory_max_bytes) = std::numeric_limits<size_t>::max();
};

class GlooBackend : public CollectiveBackend {
 public:
  /// `store` is used for the rendezvous only: give each instance a fresh PrefixStore. `timeout`
  /// bounds connecting and every collective that does not give its own.
  GlooBackend(StorePtr store, int rank, int size, std::chrono::milliseconds timeout,
              GlooBackendOptions options = {});
  ~GlooBackend() override;

  std::string name() const override { return "gloo"; }
  const GlooBackendOptions& options() const { return options_; }
  /// Whether the same-host shared-memory path is in use (connects the group if needed).
  bool uses_shared_memory();
  std::chrono::milliseconds timeout() const { return timeout_; }

  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts) override;
  WorkPtr all_reduce(at::Tensor& tensor, const AllreduceOptions& opts) override;
  WorkPtr all_reduce_coalesced(std::vector<at::Tensor>& tensors,
                               const AllreduceOptions& opts) override;
  WorkPtr reduce(at::Tensor& tensor, const ReduceOptions& opts) override;
  WorkPtr all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                     const AllgatherOptions& opts) override;
  WorkPtr all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                 const AllgatherOptions& opts) override;
  bool supports_all_gather_placed() const override { return true; }
  WorkPtr all_gather_placed(const at::Tensor& input, BlockPlacer place,
                            const AllgatherOptions& opts) override;
  WorkPtr gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                 const GatherOptions& opts) override;
  WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                  const ScatterOptions& opts) override;
  WorkPtr reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                         const ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                                const ReduceScatterOptions& opts) override;
  WorkPtr all_to_all(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                     const AllToAllOptions& opts) override;
  WorkPtr all_to_all_single(at::Tensor& output, const at::Tensor& input,
                            const std::vector<int64_t>& output_split_sizes,
                            const std::vector<int64_t>& input_split_sizes,
                            const AllToAllOptions& opts) override;
  WorkPtr barrier(const BarrierOptions& opts) override;
  WorkPtr send(const at::Tensor& tensor, int dst, const SendRecvOptions& opts) override;
  WorkPtr recv(at::Tensor& tensor, int src, const SendRecvOptions& opts) override;
  WorkPtr recv_anysource(at::Tensor& tensor, const SendRecvOptions& opts) override;
  /// Closes the connections, so that every wait on a peer (TCP or shared memory) fails within
  /// the dead-peer probe's 100 ms, and raises `reason` from those operations and later ones.
  bool abort(const std::string& reason) override;

 private:
  /// recv's body; src -1 receives from whichever peer sends first.
  WorkPtr receive(at::Tensor& tensor, int src, const SendRecvOptions& opts);
  enum class Lane { kCollective, kSend, kRecv };
  /// Queues `body` on `lane`'s worker; the returned Work completes when it has run.
  WorkPtr enqueue(Lane lane, const std::string& op, std::vector<at::Tensor> outputs,
                  std::function<void()> body);
  /// Connects the mesh once (at construction, or on first use with lazy_init).
  detail::GlooComm& comm();
  std::chrono::milliseconds effective_timeout(const CollectiveOptions& opts) const;
  /// Marks the backend broken after a communication failure and closes its connections
  /// so that peers still waiting on this rank fail fast instead of timing out.
  void fail(const std::string& reason);
  /// Hard-closes the connections if the mesh is connected (fail and abort).
  void close_connections();

  StorePtr store_;
  std::chrono::milliseconds timeout_;
  GlooBackendOptions options_;
  std::mutex connect_mutex_;
  std::shared_ptr<detail::GlooComm> comm_;
  std::unique_ptr<detail::GlooWorkQueue> collective_queue_;
  std::unique_ptr<detail::GlooWorkQueue> send_queue_;
  std::unique_ptr<detail::GlooWorkQueue> recv_queue_;
};

/// Options from the environment, the Gloo backend's one reader of it (docs/configuration.md):
/// GLOO_SOCKET_IFNAME, MASTER_ADDR, LOCAL_WORLD_SIZE / WORLD_SIZE, TORCH_GLOO_LAZY_INIT,
/// TDIST_GLOO_CHANNELS, TDIST_GLOO_SHM, TDIST_GLOO_SHM_MAX_BYTES. A value it cannot parse
/// raises InvalidArgument naming the variable.
GlooBackendOptions gloo_options_from_env();

/// Factory for the backend registry: a GlooBackend with options from the environment.
CollectiveBackendPtr make_gloo_backend(const StorePtr& store, int rank, int size,
                                       std::chrono::milliseconds timeout);

/// Registers "gloo" (devices cpu and cuda) with the backend registry; idempotent. Runs before
/// main() in every program that links tdist::tdist or tdist::gloo.
void register_gloo_backend();

}  // namespace tdist::gloo

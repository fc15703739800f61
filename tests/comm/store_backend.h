#pragma once

// A slow but simple CollectiveBackend for tests: every collective exchanges whole tensors
// through the group's store and computes the result locally. It lets the front end
// (init, groups, routing, object collectives, debug checks) be tested on any store without
// depending on a real engine. Registered as "storetest" by register_store_backend().

#include "tdist/comm/collective_backend.h"
#include "tdist/store/store.h"

namespace tdist::testing {

class StoreBackend : public CollectiveBackend {
 public:
  StoreBackend(StorePtr store, int rank, int size, std::chrono::milliseconds timeout);
  std::string name() const override { return "storetest"; }

  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts) override;
  WorkPtr all_reduce(at::Tensor& tensor, const AllreduceOptions& opts) override;
  WorkPtr all_reduce_coalesced(std::vector<at::Tensor>& tensors,
                               const AllreduceOptions& opts) override;
  WorkPtr reduce(at::Tensor& tensor, const ReduceOptions& opts) override;
  WorkPtr all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                     const AllgatherOptions& opts) override;
  WorkPtr all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                 const AllgatherOptions& opts) override;
  WorkPtr gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                 const GatherOptions& opts) override;
  WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                  const ScatterOptions& opts) override;
  WorkPtr reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                         const ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                                const ReduceScatterOptions& opts) override;
  WorkPtr all_to_all_single(at::Tensor& output, const at::Tensor& input,
                            const std::vector<int64_t>& output_split_sizes,
                            const std::vector<int64_t>& input_split_sizes,
                            const AllToAllOptions& opts) override;
  WorkPtr barrier(const BarrierOptions& opts) override;
  WorkPtr send(const at::Tensor& tensor, int dst, const SendRecvOptions& opts) override;
  WorkPtr recv(at::Tensor& tensor, int src, const SendRecvOptions& opts) override;

 private:
  /// Publishes `mine` for collective number ++seq_ and returns every rank's bytes.
  std::vector<std::vector<uint8_t>> exchange(const std::vector<uint8_t>& mine);
  at::Tensor reduce_all(const std::vector<std::vector<uint8_t>>& all, const at::Tensor& like,
                        ReduceOp op);

  StorePtr store_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
  std::map<std::string, uint64_t> p2p_counts_;
};

/// Registers "storetest" once per process (safe to call repeatedly).
void register_store_backend();

/// "gloo" when this build has the Gloo engine, else "storetest" (registered on demand).
std::string test_backend();

}  // namespace tdist::testing

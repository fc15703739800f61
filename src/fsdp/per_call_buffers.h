#pragma once

// PerCallBuffers: the general GroupBuffers. Every all-gather and reduce-scatter allocates its
// own flat buffer and copies each parameter in and out with ATen ops (collectives.h), as
// FSDP2's foreach_all_gather / foreach_reduce do: any device, any dtype, mixed precision.

#include "fsdp/group_buffers.h"

namespace tdist::fsdp::detail {

class PerCallBuffers final : public GroupBuffers {
 public:
  explicit PerCallBuffers(const GroupBuffersContext& context) : context_(context) {}

  void start_all_gather(const at::Tensor& slab, const ProcessGroupPtr& slab_group,
                        bool inputs_ordered) override;
  const WorkPtr& all_gather_work() const override { return all_gather_.work; }
  void finish_all_gather() override;
  void free_unsharded() override;
  size_t unsharded_bytes() const override;

  void start_reduce_scatter(const std::vector<at::Tensor>& grads,
                            c10::ScalarType reduce_dtype) override;
  const WorkPtr& reduce_scatter_work() const override { return reduce_.work; }
  at::Tensor& reduce_output() override { return reduce_.output; }
  void install_reduced_grads(double divisor) override;
  void drop_reduced() override { reduce_ = ReduceScatterResult(); }

 private:
  GroupBuffersContext context_;
  AllGatherResult all_gather_;  // valid while an all-gather is in flight
  ReduceScatterResult reduce_;  // valid while a reduce-scatter is pending
};

}  // namespace tdist::fsdp::detail

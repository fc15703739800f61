#pragma once

// PersistentBuffers: the GroupBuffers of Note [Persistent buffers] (flat_collectives.h). The
// group's padded shards are views of one flat shard in the all-gather input layout (no
// copy-in); every parameter's unsharded tensor is an alias of one StorageImpl whose bytes
// come from the BufferPool between unshard and reshard; the collective buffers keep their
// StorageImpls across steps (PooledTensor); the copies are memcpy over raw pointers. Where
// the backend can, the all-gather writes straight into the unsharded block (Note [Placed
// all-gather]), and the reduce-scatter into the persistent sharded-gradient buffer (Note
// [Persistent gradient buffer]).

#include "fsdp/buffer_pool.h"
#include "fsdp/group_buffers.h"

namespace tdist::fsdp::detail {

class PersistentBuffers final : public GroupBuffers {
 public:
  /// `flat_shard` ([total]) already holds the group's padded shards (fully_shard built it);
  /// `symmetric`: the pooled buffers live in symmetric memory (agreed by every rank);
  /// `placed_all_gather`: gather into the unsharded block where the backend can.
  PersistentBuffers(const GroupBuffersContext& context, at::Tensor flat_shard, bool symmetric,
                    bool placed_all_gather);
  ~PersistentBuffers() override;
  PersistentBuffers(const PersistentBuffers&) = delete;
  PersistentBuffers& operator=(const PersistentBuffers&) = delete;

  void start_all_gather(const at::Tensor& slab, const ProcessGroupPtr& slab_group,
                        bool inputs_ordered) override;
  const WorkPtr& all_gather_work() const override { return all_gather_work_; }
  void finish_all_gather() override;
  void free_unsharded() override;
  size_t unsharded_bytes() const override;

  void start_reduce_scatter(const std::vector<at::Tensor>& grads,
                            c10::ScalarType reduce_dtype) override;
  const WorkPtr& reduce_scatter_work() const override { return reduce_work_; }
  at::Tensor& reduce_output() override { return reduce_output_; }
  void install_reduced_grads(double divisor) override;
  void drop_reduced() override;

 private:
  int world() const;
  /// Bytes of the param-major unsharded block (world * total elements).
  size_t unsharded_block_bytes() const;
  void init_grad_buffer();
  /// Where the next reduce-scatter writes (reduce_direct_, reduce_flat_add_).
  void choose_reduce_target();

  GroupBuffersContext context_;
  const FlatLayout& flat_;
  bool symmetric_;
  size_t element_size_;
  at::Tensor flat_shard_;               // [total], owns every param's padded shard
  PooledTensor all_gather_out_;         // [world * total], rank-major
  at::Tensor unsharded_flat_;           // [world * total]: every param's unsharded storage
  PooledBlock unsharded_block_;         // unsharded_flat_'s bytes, held while unsharded
  PooledTensor reduce_in_;              // [world * total], rank-major
  PooledTensor reduce_tmp_;             // [total], reduce output while grads accumulate
  std::vector<at::Tensor> tmp_slices_;  // per param: its local rows of reduce_tmp_
  at::Tensor grad_flat_;                // [total], the sharded gradients (created at first reduce)
  bool placed_all_gather_ = false;      // the group's backend gathers into the unsharded block
  WorkPtr all_gather_work_;
  at::Tensor all_gather_input_;  // kept alive until the all-gather completes
  WorkPtr reduce_work_;
  at::Tensor reduce_output_;
  bool reduce_direct_ = true;     // the pending reduce-scatter writes into grad_flat_
  bool reduce_flat_add_ = false;  // ... else every trainable stash is its rows of grad_flat_
};

}  // namespace tdist::fsdp::detail

#pragma once

// ShardedParam: one parameter's sharded storage and its unsharded view.
//
// Note [Parameter identity]
// The module's parameter P (its TensorImpl, shared by the module's member field, the
// parameter dict and the optimizer) is never replaced. FSDP switches what P *holds* with
// util::set_data_in_place: at rest P holds this rank's unpadded dim-0 shard (so
// module.parameters() are the sharded parameters and any torch::optim optimizer steps them,
// with 1/N of the state); while unsharded P holds the first dim0 rows of the padded
// unsharded tensor. set_data keeps P's version counter, so tensors autograd saved from P stay
// valid across reshard/unshard.
//
// Note [Freeing unsharded storage]
// Autograd may save views of the unsharded parameter (e.g. weight.t() for addmm). Instead of
// allocating a new tensor per unshard, the padded unsharded tensor keeps one StorageImpl for
// its life: reshard frees its bytes in place (util::free_storage, 0 bytes held) and unshard
// re-allocates them in place, so those saved views see the re-gathered data in backward.

//
// Note [Mixed precision and offload]
// The sharded data (what P holds at rest, what the optimizer steps) keeps the parameter's
// dtype and lives on the host with CPU offload; the unsharded data (what P holds during
// forward/backward) has param_dtype and lives on the compute device. So P's dtype and device
// change with its shard state; autograd builds a fresh AccumulateGrad each step, and the
// unsharded gradient arrives in param_dtype. Reduced gradients are converted back to the
// sharded dtype/device when installed.

#include <functional>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/StorageImpl.h>

#include "tdist/detail/fsdp/shard_layout.h"

namespace tdist::fsdp::detail {

/// Note [Sharding on another dim]: a tensor in the moved layout ([rows, other dims...]) as the
/// parameter shows it, and a tensor shaped like the parameter (or its shard) in the moved
/// layout. Views; the identity for dim 0.
at::Tensor to_param_layout(const at::Tensor& moved, const ShardLayout& layout);
at::Tensor to_moved_layout(const at::Tensor& shown, const ShardLayout& layout);

/// How one parameter is stored sharded and computed with unsharded.
struct ParamPolicy {
  std::optional<c10::ScalarType> param_dtype;  // unsharded dtype; default: the param's
  std::optional<c10::Device> compute_device;   // unsharded device; default: the param's
  bool offload_to_cpu = false;                 // shards in host memory
  bool pin_memory = false;                     // page-locked host shards (CUDA only)
};

class ShardedParam {
 public:
  /// Shards `param` (currently holding its full data, identical on all ranks) in place.
  /// `shard_buffer` (optional): padded_shard_numel zeroed elements of the shard dtype/device
  /// to hold the padded shard (a slice of the group's flat shard, Note [Persistent buffers]).
  /// `shard_dim`: shard_placement_fn's Shard(d) (Note [Sharding on another dim]).
  ShardedParam(std::string fqn, at::Tensor param, int world, int rank,
               const ParamPolicy& policy = {}, const at::Tensor& shard_buffer = {},
               int64_t shard_dim = 0);

  /// Writes this rank's rows [local_rows, ...] of a parameter, the rows from `row_offset` on
  /// of the whole parameter, into its shard, in place.
  using RowsFill = std::function<void(const at::Tensor& rows, int64_t row_offset)>;
  /// Deferred init's loader (MaterializeOptions::load_fn): `param` is still a meta tensor;
  /// its shard is made on `device` and `fill` writes this rank's rows straight into it, so
  /// the full parameter never exists (Note [Deferred init]). Rows fill leaves alone stay 0.
  ShardedParam(std::string fqn, at::Tensor param, int world, int rank, const ParamPolicy& policy,
               const at::Tensor& shard_buffer, const c10::Device& device, const RowsFill& fill,
               int64_t shard_dim = 0);

  const std::string& fqn() const { return fqn_; }
  const at::Tensor& param() const { return param_; }
  const ShardLayout& layout() const { return layout_; }
  /// Frozen parameters (requires_grad false when sharded) are gathered, never reduced.
  bool requires_grad() const { return requires_grad_; }
  /// dtype/device of the sharded data (fp32 master, host with offload).
  const at::TensorOptions& shard_options() const { return shard_options_; }
  /// dtype/device of the unsharded data (param_dtype, compute device).
  const at::TensorOptions& unsharded_options() const { return unsharded_options_; }
  /// This rank's unpadded shard [local_rows, ...] (what P holds at rest).
  const at::Tensor& local_shard() const { return local_shard_; }

  /// This rank's padded shard, flat (padded_shard_numel elements): the all-gather input.
  at::Tensor padded_shard_flat() const { return padded_shard_.view({-1}); }
  /// The padded unsharded tensor [world*shard_rows, ...]; its storage may hold 0 bytes.
  const at::Tensor& padded_unsharded() const { return padded_unsharded_; }

  /// Re-allocates the unsharded storage in place (Note [Freeing unsharded storage]).
  void alloc_unsharded();
  /// Frees the unsharded storage in place; the parameter must hold its shard.
  void free_unsharded();
  /// Bytes the unsharded storage holds now (0 when resharded).
  size_t unsharded_nbytes() const;

  /// Points P at its unsharded data / at its shard (Note [Parameter identity]).
  void use_unsharded();
  void use_sharded();
  /// Points P at `full` (summon_full_params' separately gathered full data).
  void use_full(const at::Tensor& full);
  bool holds_unsharded() const { return holds_unsharded_; }
  /// Note [Prefetching before re-pointing]: asks the CPU to bring into cache the TensorImpls
  /// that use_unsharded / use_sharded (`unsharded`) are about to touch.
  void prefetch_pointing(bool unsharded) const {
    prefetch_impl(param_, /*write=*/true);
    prefetch_impl(unsharded ? unsharded_view_ : local_shard_, /*write=*/false);
  }

  /// Before backward: moves P's sharded gradient aside so autograd accumulates the
  /// unsharded gradient into an empty .grad.
  void stash_sharded_grad();
  /// Takes the unsharded gradient autograd produced (undefined if none) and clears P.grad.
  at::Tensor take_unsharded_grad();
  /// Adds a copy of this step's reduced shard gradient [local_rows, ...] (in the shard's
  /// dtype and device) to the stashed one and installs the sum as P.grad. `grad` undefined:
  /// just restores the stash. `non_blocking`: a copy to pinned host memory that becomes P.grad
  /// as it is (nothing to add on the host) is left in flight; returns whether one was, so
  /// the caller makes the host wait before anything reads it.
  bool accumulate_sharded_grad(const at::Tensor& grad, bool non_blocking = false);

  // ---- Note [Persistent buffers] (ParamGroup's fast path) ----
  /// Note [One unsharded storage per group]: re-homes the padded unsharded tensor, and the
  /// tensor P takes in forward, into `group_unsharded`'s storage, `offset` elements in
  /// (aliases, made while that storage holds no bytes); the group then borrows and frees
  /// that one storage for all its parameters at once.
  void share_unsharded_storage(const at::Tensor& group_unsharded, int64_t offset);
  /// The reverse, for a group leaving persistent buffers (Note [Custom collectives]): a
  /// storage of its own again (holding no bytes), and no gradient-buffer alias. Sharded only.
  void own_unsharded_storage();
  /// This param's rows [local_rows, ...] of the group's persistent gradient buffer (a plain
  /// tensor, not an autograd view, so optimizers may detach_() it).
  void set_grad_alias(at::Tensor alias);
  const at::Tensor& grad_alias() const { return grad_alias_; }
  /// Whether the stashed gradient lives in `storage` (the group's gradient buffer).
  bool stash_aliases(const c10::StorageImpl* storage) const;
  /// Installs this step's reduced gradient: `reduced` is its slice of a temporary output, or
  /// nullptr when the reduce-scatter wrote straight into grad_alias(). Accumulates onto the
  /// stash (in place) like accumulate_sharded_grad.
  void install_reduced_grad(const at::Tensor* reduced);

  /// Gradient accumulation without communication (set_requires_gradient_sync(false)): the
  /// unsharded gradient is kept here until a backward that syncs.
  void accumulate_unsharded_grad(const at::Tensor& grad);
  /// Takes the kept unsharded gradient (undefined if none).
  at::Tensor take_accumulated_unsharded_grad();

 private:
  // Both constructors: options and storage on `device`, then this rank's rows copied from
  // the full parameter or written by `fill`.
  void init(int world, int rank, int64_t shard_dim, const ParamPolicy& policy,
            const at::Tensor& shard_buffer, const c10::Device& device, const RowsFill& fill);
  /// Copies this rank's rows of `full` (shaped like the parameter) into `rows`
  /// ([local_rows, row_numel]).
  void copy_local_rows(const at::Tensor& rows, const at::Tensor& full) const;
  /// The parameter-shaped view of unsharded data at `offset` in `storage`'s storage.
  at::Tensor unsharded_alias(const at::Tensor& storage, int64_t offset) const;

  static void prefetch_impl(const at::Tensor& t, bool write) {
    const char* impl = reinterpret_cast<const char*>(t.unsafeGetTensorImpl());
    for (int line = 0; line < 4; ++line) {  // a TensorImpl spans ~3-4 cache lines
      if (write) {
        __builtin_prefetch(impl + 64 * line, 1);
      } else {
        __builtin_prefetch(impl + 64 * line, 0);
      }
    }
  }

  std::string fqn_;
  at::Tensor param_;  // the module's parameter (identity never changes)
  ShardLayout layout_;
  at::Tensor padded_shard_;                // [shard_rows, ...], owns the sharded bytes
  at::Tensor local_shard_;                 // padded_shard_[:local_rows], what P holds at rest
  at::Tensor padded_unsharded_;            // [world*shard_rows, ...], storage freed when sharded
  at::Tensor unsharded_view_;              // padded_unsharded_[:dim0] reshaped to the param's shape
  at::Tensor stashed_grad_;                // sharded grad kept aside during backward
  at::Tensor accumulated_unsharded_grad_;  // no-sync backward's gradient
  at::Tensor grad_alias_;                  // rows of the group's gradient buffer (fast path)
  at::TensorOptions shard_options_;
  at::TensorOptions unsharded_options_;
  bool requires_grad_ = true;
  bool holds_unsharded_ = false;
};

}  // namespace tdist::fsdp::detail

#pragma once

// Deferred (meta-device) initialisation: a model larger than one rank's memory is built with
// no storage, sharded, and then each rank allocates and initialises only its own shards.
//
//   GPT model{nullptr};
//   {
//     tdist::fsdp::MetaDeviceGuard meta;   // PyTorch's `with torch.device("meta"):`
//     model = GPT(config);                 // shapes and dtypes only: no memory, no RNG draws
//   }
//   for (auto& block : model->blocks) tdist::fsdp::fully_shard(block);
//   tdist::fsdp::fully_shard(model);
//   tdist::fsdp::materialize(model, tdist::fsdp::MaterializeOptions().seed(42));
//   auto opt = torch::optim::AdamW(model->parameters(), ...);
//
// Note [Deferred init]
// LibTorch's layers initialise themselves by drawing from one global generator over whole
// tensors, in construction order, so a rank cannot compute its rows of a parameter without
// computing every value drawn before them. materialize therefore initialises module by
// module, each from its own seed: for every module holding parameters or buffers directly
// (in named_modules order), it allocates them whole on `device`, seeds the default
// generator from (seed, the module's name in the model), runs init_fn on the module, and
// shards the parameters right away, keeping this rank's rows. The values are a function of
// the seed, the module names, init_fn and the device type (CPU and CUDA draw differently),
// never of the world size, the rank or the order of fully_shard calls: materialize at any
// world size gives, bitwise, the full parameters init_parameters gives a model built the
// ordinary way. A rank holds at most its shards plus one module's full parameters at once.
// Buffers and ignored parameters are materialised whole on every rank.
//
// init_fn must set every parameter and buffer the module holds directly: floating ones hold
// NaN before it runs, and any NaN left afterwards is an error naming the tensor.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "tdist/arg.h"

namespace tdist::fsdp {

/// While one is alive, tensors created on this thread (module parameters and buffers
/// included) are meta tensors: shapes and dtypes, no storage, and random initialisers draw
/// nothing. Not copyable; nests.
class MetaDeviceGuard {
 public:
  MetaDeviceGuard();
  ~MetaDeviceGuard();
  MetaDeviceGuard(const MetaDeviceGuard&) = delete;
  MetaDeviceGuard& operator=(const MetaDeviceGuard&) = delete;

 private:
  c10::impl::LocalDispatchKeySet saved_;
};

/// Initialises the parameters and buffers `module` holds directly (not its submodules'),
/// in place and without autograd. `name` is the module's name in the model ("" for the model
/// itself), as in named_modules().
using ModuleInitFn = std::function<void(const std::string& name, torch::nn::Module& module)>;

/// reset_parameters() of LibTorch's built-in layers: Linear, Bilinear, Embedding,
/// EmbeddingBag, LayerNorm, GroupNorm, Conv1-3d, ConvTranspose1-3d, BatchNorm1-3d,
/// InstanceNorm1-3d (running statistics reset too), RNN, LSTM, GRU and their cells,
/// MultiheadAttention. Throws
/// InvalidArgument for any other module type holding parameters or buffers, naming it: give
/// materialize an init_fn.
void reset_builtin_parameters(const std::string& name, torch::nn::Module& module);

/// The part of one tensor a loader fills (MaterializeOptions::load_fn): rows
/// [row_begin, row_begin + rows.size(0)) of dim 0 of the tensor named `name` (its name in
/// the model, as named_parameters() / named_buffers() give it), whose whole shape is
/// `shape`. For a parameter a deferred fully_shard call manages, the rows of this rank's
/// shard (possibly none: the loader is not called then); for every other tensor, and for a
/// parameter sharded on another dim (shard_placement_fn), all of its rows. A 0-dim tensor is
/// passed whole, as itself.
struct TensorRows {
  std::string name;
  std::vector<int64_t> shape;
  int64_t row_begin = 0;
  at::Tensor rows;  ///< a view of the tensor's storage on the device: write into it
};
using TensorLoadFn = std::function<void(const TensorRows& rows)>;

struct MaterializeOptions {
  /// Where the parameters are materialised (a rank's shards and whole buffers).
  TDIST_ARG(c10::Device, device) = c10::Device(c10::kCPU);
  /// The model's seed; each module's generator is seeded from it and the module's name.
  TDIST_ARG(uint64_t, seed) = 0;
  /// Default: reset_builtin_parameters.
  TDIST_ARG(ModuleInitFn, init_fn) = nullptr;
  /// Loads values instead of initialising them (init_fn and seed are not used): called for
  /// each meta parameter and buffer with only the rows this rank keeps. A deferred
  /// parameter's rows are its shard's own storage, so the full parameter is never allocated
  /// and a rank holds nothing of the rows other ranks own. The loader must write every
  /// element of the rows it is given (those it leaves hold 0).
  TDIST_ARG(TensorLoadFn, load_fn) = nullptr;
};

/// Gives every meta parameter and buffer under `model` storage on options.device() and its
/// values (Note [Deferred init]); parameters managed by fully_shard get only this rank's
/// shard. Collective over each FSDP group when the model is fully_shard'ed (every rank calls
/// it, after all its fully_shard calls and before forward, state_dict or the optimizer's
/// first step). The default generators' states are restored afterwards. Modules holding no
/// meta tensor are left alone, so calling it twice does nothing the second time; a module
/// whose init_fn throws gets its tensors back on the meta device, so the call can be
/// repeated with a better init_fn.
void materialize(const std::shared_ptr<torch::nn::Module>& model,
                 const MaterializeOptions& options = {});

/// The same initialisation on a model built the ordinary way (whole tensors, not
/// fully_shard'ed yet): the full values whose shards materialize gives each rank. For
/// checking deferred init, or for a model small enough to build whole; options.device() is
/// ignored (the tensors stay where they are).
void init_parameters(const std::shared_ptr<torch::nn::Module>& model,
                     const MaterializeOptions& options = {});

template <class Impl>
void materialize(const torch::nn::ModuleHolder<Impl>& model,
                 const MaterializeOptions& options = {}) {
  materialize(std::static_pointer_cast<torch::nn::Module>(model.ptr()), options);
}

template <class Impl>
void init_parameters(const torch::nn::ModuleHolder<Impl>& model,
                     const MaterializeOptions& options = {}) {
  init_parameters(std::static_pointer_cast<torch::nn::Module>(model.ptr()), options);
}

}  // namespace tdist::fsdp

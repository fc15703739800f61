#pragma once

// summon_full_params: the full parameters of a sharded model, readable (and writable back to
// the shards) in a scope, as FSDP1's FullyShardedDataParallel.summon_full_params.
//
//   {
//     tdist::fsdp::SummonFullParams full(model);            // every module unsharded
//     model->head->weight[0].fill_(0);                      // a write ...
//   }                                                       // ... lands in the shards

#include <vector>

#include <torch/nn/module.h>

#include "tdist/arg.h"
#include "tdist/fsdp/fully_shard.h"

namespace tdist::fsdp {

struct SummonFullParamsOptions {
  /// Copy the (possibly modified) full parameters back into this rank's shards on exit.
  TDIST_ARG(bool, writeback) = true;
  /// Also gather the sharded gradients into the full parameters' .grad.
  TDIST_ARG(bool, with_grads) = false;
};

/// Collective: every rank must enter and leave together. Inside the scope every parameter of
/// every fully_shard'ed module under `module` holds its full data (and dtype: mixed
/// precision does not apply). Must not be used during forward/backward.
class SummonFullParams {
 public:
  explicit SummonFullParams(const torch::nn::Module& module,
                            const SummonFullParamsOptions& options = {});
  template <class Impl>
  explicit SummonFullParams(const torch::nn::ModuleHolder<Impl>& module,
                            const SummonFullParamsOptions& options = {})
      : SummonFullParams(*module.ptr(), options) {}
  ~SummonFullParams() noexcept(false);
  SummonFullParams(const SummonFullParams&) = delete;
  SummonFullParams& operator=(const SummonFullParams&) = delete;

 private:
  std::vector<FSDPModule> modules_;
  SummonFullParamsOptions options_;
};

}  // namespace tdist::fsdp

// reset_builtin_parameters: deferred init's default init_fn (tdist/fsdp/deferred_init.h).
#include <string>

#include <torch/nn/modules.h>

#include "tdist/error.h"
#include "tdist/fsdp/deferred_init.h"

namespace tdist::fsdp {

void reset_builtin_parameters(const std::string& name, torch::nn::Module& module) {
  namespace nn = torch::nn;
#define TDIST_RESET_IF(Impl, method)                \
  if (auto* m = dynamic_cast<nn::Impl*>(&module)) { \
    m->method();                                    \
    return;                                         \
  }
  TDIST_RESET_IF(LinearImpl, reset_parameters)
  TDIST_RESET_IF(BilinearImpl, reset_parameters)
  TDIST_RESET_IF(EmbeddingImpl, reset_parameters)
  TDIST_RESET_IF(EmbeddingBagImpl, reset_parameters)
  TDIST_RESET_IF(LayerNormImpl, reset_parameters)
  TDIST_RESET_IF(GroupNormImpl, reset_parameters)
  TDIST_RESET_IF(Conv1dImpl, reset_parameters)
  TDIST_RESET_IF(Conv2dImpl, reset_parameters)
  TDIST_RESET_IF(Conv3dImpl, reset_parameters)
  TDIST_RESET_IF(ConvTranspose1dImpl, reset_parameters)
  TDIST_RESET_IF(ConvTranspose2dImpl, reset_parameters)
  TDIST_RESET_IF(ConvTranspose3dImpl, reset_parameters)
  TDIST_RESET_IF(BatchNorm1dImpl, reset_parameters)
  TDIST_RESET_IF(BatchNorm2dImpl, reset_parameters)
  TDIST_RESET_IF(BatchNorm3dImpl, reset_parameters)
  TDIST_RESET_IF(InstanceNorm1dImpl, reset_parameters)
  TDIST_RESET_IF(InstanceNorm2dImpl, reset_parameters)
  TDIST_RESET_IF(InstanceNorm3dImpl, reset_parameters)
  TDIST_RESET_IF(RNNImpl, reset_parameters)
  TDIST_RESET_IF(LSTMImpl, reset_parameters)
  TDIST_RESET_IF(GRUImpl, reset_parameters)
  TDIST_RESET_IF(RNNCellImpl, reset_parameters)
  TDIST_RESET_IF(LSTMCellImpl, reset_parameters)
  TDIST_RESET_IF(GRUCellImpl, reset_parameters)
  TDIST_RESET_IF(MultiheadAttentionImpl, _reset_parameters)
#undef TDIST_RESET_IF
  TDIST_THROW(InvalidArgument,
              "deferred init: module '" + name + "' (" + module.name() +
                  ") holds parameters or buffers of its own and is not one of LibTorch's "
                  "layers that reset_builtin_parameters knows; pass "
                  "MaterializeOptions().init_fn(f), where f initialises that module's tensors "
                  "and calls reset_builtin_parameters for the others");
}

}  // namespace tdist::fsdp

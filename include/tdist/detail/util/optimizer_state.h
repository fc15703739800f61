#pragma once

// What a LibTorch optimizer keeps per parameter, field by field: the FSDP state dicts and
// tdist::checkpoint read and write optimizer state through it (LibTorch's OptimizerParamState
// subclasses have no generic field access).

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace tdist::util {

/// One per-parameter optimizer state field, shared by the FSDP state dicts and
/// tdist::checkpoint's module adapters (plain modules included).
struct OptimizerStateField {
  std::string name;  // "exp_avg", "step", ...
  /// Tensor fields: the live state tensor (shaped like the parameter's local data). `step`:
  /// a 0-dim int64 copy; write it back with set_step.
  at::Tensor tensor;
  bool is_step = false;
  std::function<void(int64_t)> set_step;
};

/// The state `optimizer` (SGD, Adam, AdamW, Adagrad, RMSprop) keeps for `param`; empty when
/// it has none yet. Fields named in `create` that are absent are created first, as zeros
/// shaped like `like` (the parameter's local data) or step 0, creating the parameter's state
/// itself when needed. Throws InvalidArgument for other optimizer types.
std::vector<OptimizerStateField> optimizer_state_fields(torch::optim::Optimizer& optimizer,
                                                        const at::Tensor& param,
                                                        const at::Tensor& like,
                                                        const std::set<std::string>& create = {});

/// Every field name optimizer_state_fields may return ("step", "exp_avg", ...).
const std::set<std::string>& optimizer_state_field_names();

}  // namespace tdist::util

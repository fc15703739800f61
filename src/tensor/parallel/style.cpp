// Each style's three parts: how it partitions parameters, how it moves the first input, and
// how it computes (Linear, Embedding) or moves the output.

#include "tdist/tensor/parallel/style.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tensor/parallel/tp_state.h"
#include "tensor/redistribute.h"

namespace tdist::tensor::parallel {
namespace {

std::string flag(bool on) {
  return on ? "True" : "False";
}

}  // namespace

std::string ColwiseParallel::to_string() const {
  return "ColwiseParallel(input_layouts=" + tensor::to_string(input_layouts_) +
         ", output_layouts=" + tensor::to_string(output_layouts_) +
         ", use_local_output=" + flag(use_local_output_) + ")";
}

std::string RowwiseParallel::to_string() const {
  return "RowwiseParallel(input_layouts=" +
         (input_layouts_ ? tensor::to_string(*input_layouts_) : std::string("default")) +
         ", output_layouts=" + tensor::to_string(output_layouts_) +
         ", use_local_output=" + flag(use_local_output_) + ")";
}

std::string SequenceParallel::to_string() const {
  return "SequenceParallel(sequence_dim=" + std::to_string(sequence_dim_) +
         ", use_local_output=" + flag(use_local_output_) + ")";
}

std::string PrepareModuleInput::to_string() const {
  return "PrepareModuleInput(input_layouts=" + tensor::to_string(input_layouts_) +
         ", desired_input_layouts=" + tensor::to_string(desired_input_layouts_) +
         ", use_local_output=" + flag(use_local_output_) + ")";
}

std::string PrepareModuleOutput::to_string() const {
  return "PrepareModuleOutput(output_layouts=" + tensor::to_string(output_layouts_) +
         ", desired_output_layouts=" + tensor::to_string(desired_output_layouts_) +
         ", use_local_output=" + flag(use_local_output_) + ")";
}

namespace detail {
namespace {

template <class S>
const S* as(const TPState& state) {
  return dynamic_cast<const S*>(state.style.get());
}

// The parameter's data becomes this rank's part of it distributed from the mesh's first
// rank; the parameter object stays, so the module and any optimizer built later use it.
void distribute_parameter(TPState& state, torch::nn::Module& module, const std::string& name,
                          Placement placement) {
  auto parameters = module.named_parameters(/*recurse=*/false);
  at::Tensor* param = parameters.find(name);
  TDIST_CHECK_ARG(param != nullptr,
                  "parallelize_module: '" + state.path + "' has no parameter '" + name + "'");
  const DTensor d = distribute_tensor(param->detach(), state.mesh, {std::move(placement)}, 0);
  {
    at::NoGradGuard no_grad;
    param->set_data(d.to_local());
  }
  state.parameters[name] = ParameterLayout{d.placements(), d.shape()};
  record_placement(*param, state.mesh, state.parameters[name]);
}

// SequenceParallel's parameters stay whole; computing on a sequence shard gives each rank a
// partial gradient, summed over the mesh before it accumulates.
void all_reduce_gradients_of(TPState& state, torch::nn::Module& module) {
  const ProcessGroupPtr group = state.mesh.get_group(0);
  for (auto& item : module.named_parameters()) {
    at::Tensor& param = item.value();
    if (!param.requires_grad()) continue;
    {
      at::NoGradGuard no_grad;
      at::Tensor data = param.detach();
      broadcast(data, group->global_rank(0), group);
    }
    param.register_hook([group](const at::Tensor& grad) {
      at::Tensor summed = grad.clone(at::MemoryFormat::Contiguous);
      all_reduce(summed, ReduceOp::SUM, group);
      return summed;
    });
    state.parameters[item.key()] = ParameterLayout{{Replicate()}, param.sizes().vec()};
    record_placement(param, state.mesh, state.parameters[item.key()]);
  }
}

std::string unsupported(const TPState& state, const torch::nn::Module& module) {
  return "parallelize_module: " + state.style->to_string() + " shards Linear and Embedding, but '" +
         state.path + "' is " + module.name() +
         " (apply it to the Linear/Embedding submodules, or use SequenceParallel / "
         "PrepareModuleInput / PrepareModuleOutput here)";
}

// The local tensor `input` laid out as `from`, moved to `to`; its gradient will be laid out
// as `grad` (Note [DTensor autograd]), moved back in one collective.
at::Tensor moved(const TPState& state, const at::Tensor& input, const Placement& from,
                 const Placement& to, const std::optional<Placement>& grad = std::nullopt) {
  const DTensor d = DTensor::from_local(input, state.mesh, {from});
  if (!grad) return d.redistribute({to}).to_local();
  if (from == to) return d.to_local(Placements{*grad});
  return tensor::detail::moved_local(d, {to}, {*grad});
}

// PrepareModuleInput's gather-once mode: the prepared input of the modules running now.
thread_local std::vector<const c10::TensorImpl*> inputs_reduced_once;

bool reduces_once(const TPState& state) {
  const auto* s = as<PrepareModuleInput>(state);
  return s != nullptr && !s->use_local_output() && is_replicate(s->desired_input_layouts());
}

bool reduced_once(const at::Tensor& input) {
  return !inputs_reduced_once.empty() && inputs_reduced_once.back() == input.unsafeGetTensorImpl();
}

Placement rowwise_input(const TPState& state, const RowwiseParallel& style) {
  if (style.input_layouts()) return *style.input_layouts();
  return state.kind == ModuleKind::kLinear ? Placement(Shard(-1)) : Placement(Replicate());
}

DTensor colwise(const TPState& state, torch::nn::Module& module, const at::Tensor& x,
                const ColwiseParallel& style) {
  at::Tensor y;
  if (state.kind == ModuleKind::kLinear) {
    auto& linear = static_cast<torch::nn::LinearImpl&>(module);
    y = at::linear(x, linear.weight, linear.bias);
  } else {
    auto& embedding = static_cast<torch::nn::EmbeddingImpl&>(module);
    y = at::embedding(embedding.weight, x, embedding.options.padding_idx().value_or(-1));
  }
  // The shards may be uneven (torch.chunk's), so the global width comes from the weight.
  const auto& weight = state.parameters.at("weight");
  std::vector<int64_t> shape = y.sizes().vec();
  shape.back() = weight.global_shape[state.kind == ModuleKind::kLinear ? 0 : 1];
  return DTensor::from_local(y, state.mesh, {Shard(-1)}, FromLocalOptions().shape(shape))
      .redistribute({style.output_layouts()});
}

// Each rank looks up the ids in its rows of the vocabulary; the others give zeros, so the
// ranks' outputs sum to the lookup (a Partial output).
at::Tensor masked_lookup(const TPState& state, torch::nn::EmbeddingImpl& embedding,
                         const at::Tensor& ids) {
  const auto& layout = state.parameters.at("weight");
  const auto [rows, first] = local_shard_size_and_offset(layout.global_shape[0], state.mesh.size(0),
                                                         state.mesh.get_local_rank(0));
  const at::Tensor outside = (ids < first).logical_or(ids >= first + rows);
  if (rows == 0) {  // more ranks than vocabulary rows: this rank holds none (an empty shard)
    std::vector<int64_t> shape = ids.sizes().vec();
    shape.push_back(layout.global_shape[1]);
    return at::zeros(shape, embedding.weight.options());
  }
  const at::Tensor local_ids = (ids - first).masked_fill(outside, 0);
  return at::embedding(embedding.weight, local_ids).masked_fill(outside.unsqueeze(-1), 0);
}

DTensor rowwise(const TPState& state, torch::nn::Module& module, const at::Tensor& x,
                const RowwiseParallel& style) {
  const Placement out = style.output_layouts();
  if (state.kind == ModuleKind::kEmbedding) {
    auto& embedding = static_cast<torch::nn::EmbeddingImpl&>(module);
    return DTensor::from_local(masked_lookup(state, embedding, x), state.mesh, {Partial()})
        .redistribute({out});
  }
  auto& linear = static_cast<torch::nn::LinearImpl&>(module);
  at::Tensor y = DTensor::from_local(at::linear(x, linear.weight), state.mesh, {Partial()})
                     .redistribute({out})
                     .to_local();
  if (linear.bias.defined()) {
    // Added once, after the reduction. On an output shard the bias's gradient is partial.
    const std::optional<Placement> grad =
        is_shard(out) ? std::optional<Placement>(Partial()) : std::nullopt;
    y = y + moved(state, linear.bias, Replicate(), Replicate(), grad);
  }
  return DTensor::from_local(y, state.mesh, {out});
}

}  // namespace

void partition(TPState& state, torch::nn::Module& module) {
  const bool linear = state.kind == ModuleKind::kLinear;
  const bool embedding = state.kind == ModuleKind::kEmbedding;
  if (as<ColwiseParallel>(state)) {
    TDIST_CHECK_ARG(linear || embedding, unsupported(state, module));
    distribute_parameter(state, module, "weight", linear ? Shard(0) : Shard(1));
    if (linear && static_cast<torch::nn::LinearImpl&>(module).bias.defined()) {
      distribute_parameter(state, module, "bias", Shard(0));
    }
  } else if (as<RowwiseParallel>(state)) {
    TDIST_CHECK_ARG(linear || embedding, unsupported(state, module));
    distribute_parameter(state, module, "weight", linear ? Shard(1) : Shard(0));
    if (linear && static_cast<torch::nn::LinearImpl&>(module).bias.defined()) {
      distribute_parameter(state, module, "bias", Replicate());
    }
  } else if (as<SequenceParallel>(state)) {
    all_reduce_gradients_of(state, module);
  }
}

at::Tensor prepare_input(const TPState& state, const at::Tensor& input) {
  if (const auto* s = as<ColwiseParallel>(state)) {
    if (state.kind == ModuleKind::kEmbedding)
      return moved(state, input, s->input_layouts(), Replicate());
    // A replicated input meets column shards: each rank's gradient for it is partial, and
    // reduced here unless the module that prepared it reduces its consumers' sum once.
    if (is_replicate(s->input_layouts()) && reduced_once(input)) return input;
    return moved(state, input, s->input_layouts(), Replicate(), Partial());
  }
  if (const auto* s = as<RowwiseParallel>(state)) {
    const Placement desired =
        state.kind == ModuleKind::kLinear ? Placement(Shard(-1)) : Placement(Replicate());
    return moved(state, input, rowwise_input(state, *s), desired);
  }
  if (const auto* s = as<PrepareModuleInput>(state)) {
    const std::optional<Placement> grad =
        reduces_once(state) ? std::optional<Placement>(Partial()) : std::nullopt;
    return moved(state, input, s->input_layouts(), s->desired_input_layouts(), grad);
  }
  return input;
}

ReducedOnceScope::ReducedOnceScope(const TPState& state, const at::Tensor& prepared)
    : active_(reduces_once(state)) {
  if (active_) inputs_reduced_once.push_back(prepared.unsafeGetTensorImpl());
}

ReducedOnceScope::~ReducedOnceScope() {
  if (active_) inputs_reduced_once.pop_back();
}

bool computes_itself(const TPState& state) {
  return as<ColwiseParallel>(state) || as<RowwiseParallel>(state);
}

DTensor compute(const TPState& state, torch::nn::Module& module, const at::Tensor& input) {
  if (const auto* s = as<ColwiseParallel>(state)) return colwise(state, module, input, *s);
  return rowwise(state, module, input, *as<RowwiseParallel>(state));
}

DTensor prepare_output(const TPState& state, const at::Tensor& output) {
  if (const auto* s = as<SequenceParallel>(state)) {
    return DTensor::from_local(output, state.mesh, {Shard(s->sequence_dim())});
  }
  if (const auto* s = as<PrepareModuleOutput>(state)) {
    return DTensor::from_local(output, state.mesh, {s->output_layouts()})
        .redistribute({s->desired_output_layouts()});
  }
  return DTensor::from_local(output, state.mesh, {Replicate()});
}

void check_local_output(const TPState& state) {
  bool local = true;
  if (const auto* s = as<ColwiseParallel>(state)) local = s->use_local_output();
  if (const auto* s = as<RowwiseParallel>(state)) local = s->use_local_output();
  if (const auto* s = as<SequenceParallel>(state)) local = s->use_local_output();
  if (const auto* s = as<PrepareModuleOutput>(state)) local = s->use_local_output();
  TDIST_CHECK_ARG(local, "tdist::tensor::parallel::forward: '" + state.path + "' has " +
                             state.style->to_string() +
                             "; call forward_dtensor for its DTensor output");
}

}  // namespace detail
}  // namespace tdist::tensor::parallel

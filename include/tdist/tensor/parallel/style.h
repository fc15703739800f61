#pragma once

// Tensor-parallel styles (torch.distributed.tensor.parallel's ColwiseParallel, RowwiseParallel,
// SequenceParallel, PrepareModuleInput, PrepareModuleOutput) for torch::nn modules on a 1-D
// mesh. parallelize_module applies them: a style shards the module's parameters in place
// (each rank keeps its local shard as the same torch::nn parameter, so optimizers and FSDP
// see ordinary tensors) and says how tdist::tensor::parallel::forward moves the module's
// input and output between layouts.
//
// Note [Local tensors between modules]: LibTorch has no tensor subclass to carry placements
// from one module to the next, so what flows between modules is always a local tensor, laid
// out as the producing style's output_layouts say and read by the consuming style as its
// input_layouts say. use_local_output(false) is for forward_dtensor, which returns the
// DTensor. Gradients flowing between modules are whole gradients of the local tensors
// (normalized placements, Note [DTensor autograd]): each style reduces the partial gradients
// it creates (a column-parallel Linear all-reduces its replicated input's gradient, a
// sequence-parallel norm its parameters' gradients).

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "tdist/tensor/placement.h"

namespace tdist::tensor::parallel {

/// What every style shares: layouts of the first tensor input and of the output.
class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  /// "ColwiseParallel(input_layouts=(Replicate()), output_layouts=(Shard(dim=-1)), ...)".
  virtual std::string to_string() const = 0;
};

/// Linear: weight and bias Shard(0) (output features); Embedding: weight Shard(1). Input
/// moved to Replicate; the output is Shard(-1), moved to output_layouts.
class ColwiseParallel : public ParallelStyle {
 public:
  ColwiseParallel& input_layouts(Placement p) {
    input_layouts_ = std::move(p);
    return *this;
  }
  ColwiseParallel& output_layouts(Placement p) {
    output_layouts_ = std::move(p);
    return *this;
  }
  ColwiseParallel& use_local_output(bool on) {
    use_local_output_ = on;
    return *this;
  }
  const Placement& input_layouts() const { return input_layouts_; }
  const Placement& output_layouts() const { return output_layouts_; }
  bool use_local_output() const { return use_local_output_; }
  std::string to_string() const override;

 private:
  Placement input_layouts_ = Replicate();
  Placement output_layouts_ = Shard(-1);
  bool use_local_output_ = true;
};

/// Linear: weight Shard(1) (input features), bias Replicate, added once after the partial
/// outputs are reduced; input moved to Shard(-1). Embedding: weight Shard(0) (vocabulary
/// rows), input Replicate, each rank looks up the ids it holds. The Partial output is
/// reduced to output_layouts (Replicate: all-reduce; Shard(d): reduce-scatter).
class RowwiseParallel : public ParallelStyle {
 public:
  RowwiseParallel& input_layouts(Placement p) {
    input_layouts_ = std::move(p);
    return *this;
  }
  RowwiseParallel& output_layouts(Placement p) {
    output_layouts_ = std::move(p);
    return *this;
  }
  RowwiseParallel& use_local_output(bool on) {
    use_local_output_ = on;
    return *this;
  }
  /// Default: Shard(-1) for Linear, Replicate for Embedding.
  const std::optional<Placement>& input_layouts() const { return input_layouts_; }
  const Placement& output_layouts() const { return output_layouts_; }
  bool use_local_output() const { return use_local_output_; }
  std::string to_string() const override;

 private:
  std::optional<Placement> input_layouts_;
  Placement output_layouts_ = Replicate();
  bool use_local_output_ = true;
};

/// Norms and dropout on a sequence shard: parameters stay replicated (their gradients,
/// partial per sequence shard, are all-reduced); the input is this rank's shard along
/// sequence_dim and so is the output.
class SequenceParallel : public ParallelStyle {
 public:
  SequenceParallel& sequence_dim(int64_t dim) {
    sequence_dim_ = dim;
    return *this;
  }
  SequenceParallel& use_local_output(bool on) {
    use_local_output_ = on;
    return *this;
  }
  int64_t sequence_dim() const { return sequence_dim_; }
  bool use_local_output() const { return use_local_output_; }
  std::string to_string() const override;

 private:
  int64_t sequence_dim_ = 1;
  bool use_local_output_ = true;
};

/// Moves the module's first input from input_layouts to desired_input_layouts.
///
/// use_local_output(false) with a Replicate desired layout is torchtitan's "gather once"
/// (PyTorch: the module receives a DTensor, and the column-parallel projections inside give
/// it Partial gradients that are reduced once): the module still receives a local tensor,
/// but the ColwiseParallel modules it passes that very tensor to leave their input gradients
/// partial, and their sum is reduced here, once (a reduce-scatter back to a sequence shard),
/// instead of once per projection. Every use of the input inside the module must then be a
/// column-parallel module (attention's q/k/v, the MLP's gate/up), since any other use would
/// give a whole gradient that the reduction counts once per rank. Default true: each consumer
/// reduces its own gradient, correct whatever the module does.
class PrepareModuleInput : public ParallelStyle {
 public:
  PrepareModuleInput& input_layouts(Placement p) {
    input_layouts_ = std::move(p);
    return *this;
  }
  PrepareModuleInput& desired_input_layouts(Placement p) {
    desired_input_layouts_ = std::move(p);
    return *this;
  }
  PrepareModuleInput& use_local_output(bool on) {
    use_local_output_ = on;
    return *this;
  }
  const Placement& input_layouts() const { return input_layouts_; }
  const Placement& desired_input_layouts() const { return desired_input_layouts_; }
  bool use_local_output() const { return use_local_output_; }
  std::string to_string() const override;

 private:
  Placement input_layouts_ = Replicate();
  Placement desired_input_layouts_ = Replicate();
  bool use_local_output_ = true;
};

/// Moves the module's output from output_layouts to desired_output_layouts.
class PrepareModuleOutput : public ParallelStyle {
 public:
  PrepareModuleOutput& output_layouts(Placement p) {
    output_layouts_ = std::move(p);
    return *this;
  }
  PrepareModuleOutput& desired_output_layouts(Placement p) {
    desired_output_layouts_ = std::move(p);
    return *this;
  }
  PrepareModuleOutput& use_local_output(bool on) {
    use_local_output_ = on;
    return *this;
  }
  const Placement& output_layouts() const { return output_layouts_; }
  const Placement& desired_output_layouts() const { return desired_output_layouts_; }
  bool use_local_output() const { return use_local_output_; }
  std::string to_string() const override;

 private:
  Placement output_layouts_ = Replicate();
  Placement desired_output_layouts_ = Replicate();
  bool use_local_output_ = true;
};

/// A style held by a plan: any of the above, copied in.
class StyleRef {
 public:
  template <class S, std::enable_if_t<std::is_base_of_v<ParallelStyle, S>, int> = 0>
  StyleRef(S style) : style_(std::make_shared<S>(std::move(style))) {}  // NOLINT: implicit
  const std::shared_ptr<const ParallelStyle>& get() const { return style_; }

 private:
  std::shared_ptr<const ParallelStyle> style_;
};

/// Module paths relative to the module given to parallelize_module, "." separated; each
/// part may be an fnmatch pattern ("layers.*.attention.wq").
using ParallelizePlan = std::map<std::string, StyleRef>;

}  // namespace tdist::tensor::parallel

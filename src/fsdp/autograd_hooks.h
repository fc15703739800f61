#pragma once

// The two autograd functions through which FSDP gets control in backward.
//
// Note [Backward hooks]
// LibTorch modules have no backward hooks either, so FSDP threads identity autograd
// functions through the module's boundary tensors:
//  - its outputs pass through PreBackward, whose backward runs before any of the module's
//    own backward (it is the first node the output gradients reach): it unshards;
//  - its tensor inputs pass through PostBackward, whose backward runs once the gradient
//    w.r.t. the inputs is complete, i.e. after the module's whole backward (the engine runs
//    AccumulateGrad nodes first, so the parameter grads are in .grad by then): it
//    reduce-scatters.
// Modules whose inputs need no grad (the root: token ids) are finished by the root's
// end-of-backward callback instead.

#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tdist::fsdp::detail {

class FSDPState;

std::vector<at::Tensor> register_pre_backward(FSDPState* state, std::vector<at::Tensor> outputs);
std::vector<at::Tensor> register_post_backward(FSDPState* state, std::vector<at::Tensor> inputs);

/// Queues `fn` to run when the current backward pass ends (must be called during backward).
void queue_end_of_backward_callback(std::function<void()> fn);

}  // namespace tdist::fsdp::detail

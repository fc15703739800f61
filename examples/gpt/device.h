#pragma once

// --device: where a rank computes. "auto" takes CUDA when this node has a GPU for each of its
// ranks (LOCAL_WORLD_SIZE <= visible GPUs), the CPU otherwise, so every rank of a node
// decides the same; "cuda" insists and says why it cannot; "cpu" never touches CUDA.

#include <string>

#include <c10/core/Device.h>

namespace gpt {

/// The device rank `local_rank` of `local_world_size` on this node computes on for
/// `requested` ("cpu", "cuda" or "auto"): the CPU, or cuda:<local_rank>. Throws
/// tdist::InvalidArgument naming the fix when CUDA is asked for and cannot be had.
c10::Device resolve_device(const std::string& requested, int local_rank, int local_world_size);

/// init_process_group's backend for ranks computing on `device`: "gloo" on the CPU;
/// "cpu:gloo,cuda:nccl" on CUDA where NCCL is built, else "gloo" (CUDA tensors staged
/// through pinned host memory).
std::string backend_for(const c10::Device& device, bool nccl_available);

}  // namespace gpt

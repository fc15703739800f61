#pragma once

// Rotary position embeddings as transformers computes them (modeling_rope_utils.py): the
// inverse frequencies of rope types default, linear, dynamic (NTK, recomputed for sequences
// longer than max_position_embeddings) and llama3 (Llama 3.1's smoothed scaling), the
// cos / sin tables, and their application to queries and keys (rotate_half).

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "tdist/models/config.h"

namespace tdist::models {

/// float32 [head_dim / 2]; `seq_len` matters to dynamic only.
at::Tensor rope_inverse_frequencies(const ModelConfig& config, int64_t seq_len);

/// cos and sin [T, head_dim] for positions 0..T-1, computed in float32 and cast to `dtype`.
std::pair<at::Tensor, at::Tensor> rope_tables(const ModelConfig& config, int64_t length,
                                              const c10::Device& device, c10::ScalarType dtype);

/// x * cos + rotate_half(x) * sin for x [B, H, T, D] and tables [T, D].
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace tdist::models

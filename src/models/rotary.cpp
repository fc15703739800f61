#include "tdist/models/rotary.h"

#include <cmath>

#include <ATen/ATen.h>

namespace tdist::models {
namespace {

// base ** (arange(0, dim, 2) / dim), inverted: the frequencies of the default rope.
at::Tensor base_frequencies(double base, int64_t dim) {
  const at::Tensor exponents =
      at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
      static_cast<double>(dim);
  return 1.0 / at::pow(at::Scalar(base), exponents);
}

// Llama 3.1: long wavelengths divided by `factor`, short ones kept, the band between
// interpolated (transformers' _compute_llama3_parameters).
at::Tensor llama3_frequencies(const RopeConfig& rope, const at::Tensor& inv_freq) {
  const double old_context = static_cast<double>(rope.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / rope.low_freq_factor;
  const double high_freq_wavelen = old_context / rope.high_freq_factor;
  const at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq);
  const at::Tensor smooth = (old_context / wavelen - rope.low_freq_factor) /
                            (rope.high_freq_factor - rope.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
  const at::Tensor medium =
      (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, scaled);
}

}  // namespace

at::Tensor rope_inverse_frequencies(const ModelConfig& config, int64_t seq_len) {
  const RopeConfig& rope = config.rope;
  const int64_t dim = config.head_dim;
  if (rope.type == "linear") return base_frequencies(rope.theta, dim) / rope.factor;
  if (rope.type == "llama3") return llama3_frequencies(rope, base_frequencies(rope.theta, dim));
  if (rope.type == "dynamic") {
    // NTK scaling: the base grows once the sequence outgrows the trained context.
    const double max_positions = static_cast<double>(config.max_position_embeddings);
    const double len = std::max(static_cast<double>(seq_len), max_positions);
    const double d = static_cast<double>(dim);
    const double base =
        rope.theta * std::pow((rope.factor * len / max_positions) - (rope.factor - 1), d / (d - 2));
    return base_frequencies(base, dim);
  }
  return base_frequencies(rope.theta, dim);
}

std::pair<at::Tensor, at::Tensor> rope_tables(const ModelConfig& config, int64_t length,
                                              const c10::Device& device, c10::ScalarType dtype) {
  const at::Tensor inv_freq = rope_inverse_frequencies(config, length).to(device);
  const at::Tensor positions =
      at::arange(length, at::TensorOptions().device(device)).to(at::kFloat);
  const at::Tensor freqs = positions.unsqueeze(-1) * inv_freq;
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace tdist::models

#include "tdist/ddp/powersgd_hook.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "tdist/comm/distributed.h"
#include "tdist/error.h"

namespace tdist::ddp {

namespace {

/// Gram-Schmidt over the columns of each matrix of a batch (b x n x r), in place.
void orthogonalize_gram_schmidt(const at::Tensor& matrices, double epsilon) {
  const int64_t columns = matrices.size(2);
  for (int64_t i = 0; i < columns; ++i) {
    at::Tensor column = matrices.narrow(2, i, 1);
    at::Tensor norm = at::linalg_vector_norm(column, 2, {1}, /*keepdim=*/true);
    column.div_(epsilon == 0 ? norm : norm + epsilon);
    if (i + 1 < columns) {
      at::Tensor rest = matrices.narrow(2, i + 1, columns - i - 1);
      rest.sub_((column * rest).sum({1}, /*keepdim=*/true) * column);
    }
  }
}

/// PyTorch's choice: QR for ranks above 2 in full precision (faster), Gram-Schmidt otherwise
/// (QR has no half-precision kernels).
void orthogonalize(const at::Tensor& matrices, double epsilon) {
  const auto dtype = matrices.scalar_type();
  if (matrices.size(2) <= 2 || dtype == at::kHalf || dtype == at::kBFloat16) {
    return orthogonalize_gram_schmidt(matrices, epsilon);
  }
  matrices.copy_(std::get<0>(at::linalg_qr(matrices)));
}

}  // namespace

// ---- PowerSGDState ---------------------------------------------------------------------

PowerSGDState::PowerSGDState(PowerSGDOptions options)
    : options_(std::move(options)), rng_(options_.random_seed()) {
  TDIST_CHECK_ARG(options_.matrix_approximation_rank() >= 1,
                  "PowerSGD: matrix_approximation_rank must be at least 1, got " +
                      std::to_string(options_.matrix_approximation_rank()));
  TDIST_CHECK_ARG(options_.min_compression_rate() > 0,
                  "PowerSGD: min_compression_rate must be positive, got " +
                      std::to_string(options_.min_compression_rate()));
  TDIST_CHECK_ARG(options_.orthogonalization_epsilon() >= 0,
                  "PowerSGD: orthogonalization_epsilon must not be negative");
  // As PyTorch: state remembered from the first iterations would outlive DDP's bucket layout
  // there; tdist keeps the rule so that settings move between the two unchanged.
  TDIST_CHECK_ARG(!(options_.use_error_feedback() || options_.warm_start()) ||
                      options_.start_powerSGD_iter() > 1,
                  "PowerSGD: start_powerSGD_iter must be > 1 when use_error_feedback or "
                  "warm_start is on (got " +
                      std::to_string(options_.start_powerSGD_iter()) +
                      "); start later or turn both off");
}

uint64_t PowerSGDState::next_seed() {
  // numpy's legacy RandomState.randint(1_000_000_000): 32-bit Mersenne Twister draws masked
  // to the next power of two, rejected above the bound.
  constexpr uint32_t kMask = (1u << 30) - 1;
  constexpr uint32_t kBound = 999'999'999;
  while (true) {
    uint32_t draw = static_cast<uint32_t>(rng_()) & kMask;
    if (draw <= kBound) return draw;
  }
}

void PowerSGDState::maybe_increase_iter(bool is_last_bucket) {
  if (is_last_bucket) ++iter_;
}

PowerSGDState::CompressionStats PowerSGDState::compression_stats() const {
  CompressionStats stats;
  stats.numel_before_compression = numel_before_;
  stats.numel_after_compression = numel_after_;
  if (numel_after_ > 0) stats.compress_rate = static_cast<double>(numel_before_) / numel_after_;
  return stats;
}

// ---- One compressed step of one bucket -------------------------------------------------

/// The hook's work for one bucket once compression has started: sorts the bucket's gradients
/// into compressed and uncompressed, computes P = M Q, and returns a future whose continuation
/// reduces the rest (P, then Q = M^T P) and decompresses M = P Q^T.
struct PowerSGDStep {
  /// Matrices of one shape, in the order their shape first appears in the bucket.
  struct ShapeGroup {
    std::vector<int64_t> shape;
    std::vector<at::Tensor> matrices;
  };

  PowerSGDState& state;
  const PowerSGDOptions& options;
  ProcessGroupPtr group;
  size_t bucket_index;
  bool is_last;
  at::Tensor input;
  at::Tensor input_before;  // error feedback: the input before compression
  std::vector<at::Tensor> uncompressed;
  at::Tensor uncompressed_memory;
  std::vector<ShapeGroup> shape_groups;
  std::vector<at::Tensor> batches;  // b x n x m, views of the gradients or stacked copies
  at::Tensor p_memory, q_memory;    // this bucket's factors, flat (the state may drop them)
  std::vector<at::Tensor> ps, qs;   // b x n x r and b x m x r, views of the factor memories

  PowerSGDStep(PowerSGDState& s, const GradBucket& bucket, ProcessGroupPtr g)
      : state(s),
        options(s.options_),
        group(std::move(g)),
        bucket_index(bucket.index()),
        is_last(bucket.is_last()),
        input(bucket.buffer()) {}

  int64_t rank_for(int64_t n, int64_t m) const {
    return std::min({n, m, options.matrix_approximation_rank()});
  }

  void apply_error_feedback() {
    if (!options.use_error_feedback()) return;
    auto [it, fresh] = state.error_.try_emplace(bucket_index);
    if (fresh) {
      it->second = at::zeros_like(input);
    } else {
      input.add_(it->second);
    }
    input_before = input.detach().clone();
  }

  /// Splits the gradients; returns the flat sizes the P and Q factors need.
  std::pair<int64_t, int64_t> sort_gradients(const std::vector<at::Tensor>& gradients) {
    int64_t p_size = 0, q_size = 0;
    for (const at::Tensor& gradient : gradients) {
      if (gradient.dim() == 0) {  // a scalar: nothing to factor
        uncompressed.push_back(gradient);
        state.numel_before_ += 1;
        state.numel_after_ += 1;
        continue;
      }
      at::Tensor matrix = gradient.view({gradient.size(0), -1});
      const int64_t n = matrix.size(0), m = matrix.size(1), r = rank_for(n, m);
      const int64_t compressed_numel = (n + m) * r;
      state.numel_before_ += n * m;
      if (static_cast<double>(compressed_numel) * options.min_compression_rate() < n * m) {
        add_to_shape_group(matrix);
        p_size += n * r;
        q_size += m * r;
        state.numel_after_ += compressed_numel;
      } else {
        uncompressed.push_back(gradient);
        state.numel_after_ += n * m;
      }
    }
    return {p_size, q_size};
  }

  void add_to_shape_group(const at::Tensor& matrix) {
    std::vector<int64_t> shape = matrix.sizes().vec();
    for (ShapeGroup& group_of_shape : shape_groups) {
      if (group_of_shape.shape == shape) return group_of_shape.matrices.push_back(matrix);
    }
    shape_groups.push_back({std::move(shape), {matrix}});
  }

  void pack_uncompressed() {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& tensor : uncompressed) flat.push_back(tensor.reshape(-1));
    uncompressed_memory = flat.empty() ? at::empty({0}, input.options()) : at::cat(flat);
  }

  /// Lays the batches and their factors out in PyTorch's order (shape groups in first-seen
  /// order), so that the same seed gives the same random Q.
  void lay_out_factors(int64_t p_size, int64_t q_size, bool fresh) {
    if (fresh) {
      state.p_memory_[bucket_index] = at::empty({p_size}, input.options());
      state.q_memory_[bucket_index] = at::empty({q_size}, input.options());
    }
    p_memory = state.p_memory_[bucket_index];
    q_memory = state.q_memory_[bucket_index];
    int64_t p_offset = 0, q_offset = 0;
    auto add_batch = [&](const at::Tensor& batch) {
      const int64_t b = batch.size(0), n = batch.size(1), m = batch.size(2), r = rank_for(n, m);
      batches.push_back(batch);
      ps.push_back(p_memory.narrow(0, p_offset, b * n * r).view({b, n, r}));
      qs.push_back(q_memory.narrow(0, q_offset, b * m * r).view({b, m, r}));
      p_offset += b * n * r;
      q_offset += b * m * r;
    };
    for (const ShapeGroup& group_of_shape : shape_groups) {
      const auto& matrices = group_of_shape.matrices;
      if (options.batch_tensors_with_same_shape() && matrices.size() > 1) {
        add_batch(at::stack(matrices));
      } else {
        for (const at::Tensor& matrix : matrices) add_batch(matrix.unsqueeze(0));
      }
    }
  }

  void initialise_qs(bool fresh) {
    if (!fresh) {
      for (const at::Tensor& q : qs) orthogonalize(q, options.orthogonalization_epsilon());
      return;
    }
    // PyTorch seeds torch's CPU generator from its numpy generator once per fresh bucket and
    // draws each Q on the CPU; a private generator gives the same numbers without touching
    // the global one.
    at::Generator generator = at::detail::createCPUGenerator(state.next_seed());
    for (const at::Tensor& q : qs) {
      q.copy_(at::randn(q.sizes(), generator, q.options().device(at::kCPU)));
      orthogonalize(q, options.orthogonalization_epsilon());
    }
  }

  /// Returns the uncompressed tensors' all-reduce (null when there are none).
  WorkPtr start(const std::vector<at::Tensor>& gradients) {
    apply_error_feedback();
    auto [p_size, q_size] = sort_gradients(gradients);
    pack_uncompressed();
    const bool fresh = !options.warm_start() || !state.p_memory_.count(bucket_index);
    lay_out_factors(p_size, q_size, fresh);
    initialise_qs(fresh);
    for (size_t i = 0; i < batches.size(); ++i) at::bmm_out(ps[i], batches[i], qs[i]);
    if (uncompressed_memory.numel() == 0) return nullptr;
    return all_reduce(uncompressed_memory, ReduceOp::SUM, group, /*async_op=*/true);
  }

  /// Runs when the uncompressed all-reduce is done (DDP waits bucket futures in order, so
  /// every rank issues the factors' all-reduces in the same order).
  at::Tensor finish() {
    unpack_uncompressed();
    all_reduce_sync(p_memory);
    for (const at::Tensor& p : ps) orthogonalize(p, options.orthogonalization_epsilon());
    for (size_t i = 0; i < batches.size(); ++i) {
      at::bmm_out(qs[i], batches[i].transpose(1, 2), ps[i]);
    }
    all_reduce_sync(q_memory);
    q_memory.div_(group->size());
    for (size_t i = 0; i < batches.size(); ++i) {
      at::bmm_out(batches[i], ps[i], qs[i].transpose(1, 2));
    }
    copy_back_stacked_batches();
    if (options.use_error_feedback()) state.error_[bucket_index] = input_before - input;
    if (!options.warm_start()) {
      state.p_memory_.clear();
      state.q_memory_.clear();
    }
    state.maybe_increase_iter(is_last);
    return input;
  }

  void unpack_uncompressed() {
    if (uncompressed_memory.numel() == 0) return;
    uncompressed_memory.div_(group->size());
    int64_t offset = 0;
    for (const at::Tensor& tensor : uncompressed) {
      tensor.copy_(uncompressed_memory.narrow(0, offset, tensor.numel()).view_as(tensor));
      offset += tensor.numel();
    }
  }

  void all_reduce_sync(const at::Tensor& tensor) {
    if (tensor.numel() > 0) all_reduce(tensor, ReduceOp::SUM, group);
  }

  /// Batched, each shape group is one batch, a stacked copy when it holds several matrices.
  void copy_back_stacked_batches() {
    if (!options.batch_tensors_with_same_shape()) return;
    for (size_t g = 0; g < shape_groups.size(); ++g) {
      const auto& matrices = shape_groups[g].matrices;
      if (matrices.size() == 1) continue;  // a view of the gradient: written in place
      for (size_t i = 0; i < matrices.size(); ++i) matrices[i].copy_(batches[g][i]);
    }
  }
};

CommHookFuture powerSGD_hook(PowerSGDState& state, GradBucket& bucket) {
  const ProcessGroupPtr& group =
      state.options().process_group() ? state.options().process_group() : bucket.process_group();
  if (state.iter_ < state.options().start_powerSGD_iter()) {
    state.maybe_increase_iter(bucket.is_last());
    // DDP's own averaging, over the state's group.
    GradBucket over_group(bucket.index(), bucket.is_last(), bucket.buffer(), bucket.gradients(),
                          bucket.parameters(), group);
    return allreduce_hook(over_group);
  }
  auto step = std::make_shared<PowerSGDStep>(state, bucket, group);
  WorkPtr work = step->start(bucket.gradients());
  // The continuation keeps the step (its views and factors) alive until DDP waits on it.
  return CommHookFuture(std::move(work), [step] { return step->finish(); });
}

}  // namespace tdist::ddp

#include "gpt/parallel.h"

#include <cmath>
#include <map>
#include <optional>

#include "tdist/error.h"
#ifdef TDIST_GPT_WITH_COMM
#include "tdist/comm/distributed.h"
#endif
#ifdef TDIST_GPT_WITH_DDP
#include "tdist/ddp/distributed_data_parallel.h"
#endif
#ifdef TDIST_GPT_WITH_FSDP
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/shard_layout.h"
#include "tdist/fsdp/trace.h"
#endif

namespace gpt {
namespace {

// One process: plain autograd.
class SingleParallel : public Parallel {
 public:
  explicit SingleParallel(GPT model) : model_(std::move(model)) {}
  std::string name() const override { return "single"; }
  torch::Tensor forward(const torch::Tensor& idx, bool /*sync*/) override {
    return model_->forward(idx);
  }
  torch::Tensor forward_eval(const torch::Tensor& idx) override { return model_->forward(idx); }
  void backward(const torch::Tensor& loss) override { loss.backward(); }
  ParamGroups param_groups() override { return split_for_weight_decay(*model_); }
  double clip_grad_norm(double max_norm) override {
    return torch::nn::utils::clip_grad_norm_(model_->parameters(), max_norm);
  }
  tdist::ShardedStateDict parameter_slices() override {
    tdist::ShardedStateDict slices;
    for (auto& item : model_->named_parameters()) {
      slices[item.key()] = tdist::ShardedTensor::whole(item.value());
    }
    return slices;
  }
  bool replicated() const override { return true; }
  GPT& model() override { return model_; }

 protected:
  GPT model_;
};

#if defined(TDIST_GPT_WITH_DDP)
// tdist::ddp: replicated model, gradients all-reduced in buckets during backward.
class DdpParallel : public SingleParallel {
 public:
  explicit DdpParallel(GPT model)
      : SingleParallel(std::move(model)),
        ddp_(std::make_unique<tdist::ddp::DistributedDataParallel>(model_)) {}
  std::string name() const override { return "ddp"; }
  torch::Tensor forward(const torch::Tensor& idx, bool sync) override {
    no_sync_.reset();
    if (!sync) no_sync_.emplace(ddp_.get());  // held until this micro-step's backward
    return ddp_->forward([&] { return model_->forward(idx); });
  }
  // Evaluation calls the module directly: DDP's pre-forward would arm the reducer for a
  // backward that never comes.
  void backward(const torch::Tensor& loss) override {
    loss.backward();
    no_sync_.reset();
  }

 private:
  std::unique_ptr<tdist::ddp::DistributedDataParallel> ddp_;
  std::optional<tdist::ddp::DistributedDataParallel::NoSyncGuard> no_sync_;
};
#elif defined(TDIST_GPT_WITH_COMM)
// Without tdist::ddp in the build: the same averaging as one all-reduce of all gradients
// after the last micro-step's backward (no overlap with backward).
class DdpParallel : public SingleParallel {
 public:
  DdpParallel(GPT model, const World& world, Tracer& tracer)
      : SingleParallel(std::move(model)), world_(world), tracer_(tracer) {
    torch::NoGradGuard no_grad;
    for (auto& p : model_->parameters()) tdist::broadcast(p.data(), 0);
  }
  std::string name() const override { return "ddp (all-reduce)"; }
  torch::Tensor forward(const torch::Tensor& idx, bool sync) override {
    sync_ = sync;
    return model_->forward(idx);
  }
  void backward(const torch::Tensor& loss) override {
    loss.backward();
    if (!sync_) return;
    TraceSpan span(tracer_, "all_reduce(grads)", "comm", 1);
    std::vector<torch::Tensor> grads, flat_views;
    for (auto& p : model_->parameters()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
    if (grads.empty()) return;
    for (auto& g : grads) flat_views.push_back(g.reshape({-1}));
    auto flat = torch::cat(flat_views);
    tdist::all_reduce(flat, tdist::ReduceOp::SUM);
    flat.div_(static_cast<double>(world_.world_size));
    int64_t offset = 0;
    for (auto& g : grads) {
      g.copy_(flat.slice(0, offset, offset + g.numel()).view_as(g));
      offset += g.numel();
    }
  }

 private:
  World world_;
  Tracer& tracer_;
  bool sync_ = true;
};
#endif

#ifdef TDIST_GPT_WITH_FSDP
// tdist::fsdp::fully_shard: each block, then the root (embeddings, final norm, head), as
// torchtitan's apply_fsdp does. Parameters, gradients and AdamW state are 1/N per rank.
class FsdpParallel : public Parallel {
 public:
  FsdpParallel(GPT model, const World& world, Tracer& tracer, bool cpu_offload)
      : model_(std::move(model)), world_(world), tracer_(tracer) {
    ensure_process_group(world_);  // FSDP shards over a group, of one at world 1
    for (auto& item : model_->named_parameters())
      full_shapes_[item.key()] = item.value().sizes().vec();
    if (tracer_.enabled()) {
      // FSDP's all-gather / reduce-scatter phases go on the trace's communication row.
      const int64_t origin_ns = tracer_.origin_ns();
      tdist::fsdp::set_span_callback([this, origin_ns](const tdist::fsdp::Span& span) {
        tracer_.add_span(span.name, "fsdp", (span.begin_ns - origin_ns) / 1000,
                         (span.end_ns - origin_ns) / 1000, /*tid=*/1);
      });
    }
    tdist::fsdp::FullyShardOptions options;
    // --cpu-offload: shards, gradients and AdamW state in host memory (page-locked for CUDA).
    if (cpu_offload) {
      options.offload_policy(tdist::fsdp::CPUOffloadPolicy(/*pin_memory=*/world.device.is_cuda()));
    }
    for (const auto& block : model_->block_list()) {
      tdist::fsdp::fully_shard(std::static_pointer_cast<torch::nn::Module>(block), options);
    }
    tdist::fsdp::fully_shard(model_, options);
    model_->set_block_runner([](const std::shared_ptr<BlockImpl>& block, const torch::Tensor& x) {
      auto b = block;
      return tdist::fsdp::forward(b, x);
    });
  }
  ~FsdpParallel() override {
    if (tracer_.enabled()) tdist::fsdp::set_span_callback(nullptr);
  }
  std::string name() const override { return "fsdp"; }
  // FSDP reduce-scatters on every backward; accumulation adds the reduced shards.
  torch::Tensor forward(const torch::Tensor& idx, bool /*sync*/) override {
    return tdist::fsdp::forward(model_, idx);
  }
  torch::Tensor forward_eval(const torch::Tensor& idx) override {
    return tdist::fsdp::forward(model_, idx);
  }
  void backward(const torch::Tensor& loss) override { loss.backward(); }
  ParamGroups param_groups() override { return split_for_weight_decay(*model_); }
  double clip_grad_norm(double max_norm) override {
    // The shards are disjoint: the squared norm is the sum over ranks of the local ones.
    std::vector<torch::Tensor> grads;
    auto sq = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(world_.device));
    for (auto& p : model_->parameters()) {
      if (!p.grad().defined()) continue;
      grads.push_back(p.grad());
      sq += p.grad().to(torch::kDouble).pow(2).sum();
    }
    tdist::all_reduce(sq, tdist::ReduceOp::SUM);
    const double norm = std::sqrt(sq.item<double>());
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      torch::NoGradGuard no_grad;
      for (auto& g : grads) g.mul_(coef);
    }
    return norm;
  }
  tdist::ShardedStateDict parameter_slices() override {
    // Note [Dim-0 padding] (tdist/fsdp/shard_layout.h): rank r owns rows
    // [row_offset, row_offset + local_rows) of each parameter.
    tdist::ShardedStateDict slices;
    for (auto& item : model_->named_parameters()) {
      const auto& shape = full_shapes_.at(item.key());
      auto layout = tdist::fsdp::ShardLayout::compute(shape, world_.world_size, world_.rank);
      TDIST_CHECK_ARG(item.value().numel() == layout.local_numel(),
                      "gpt fsdp: parameter " + item.key() + " holds " +
                          std::to_string(item.value().numel()) + " elements on rank " +
                          std::to_string(world_.rank) + ", expected its unpadded shard of " +
                          std::to_string(layout.local_numel()));
      std::vector<int64_t> offsets(shape.size(), 0);
      if (!offsets.empty()) offsets[0] = layout.row_offset;
      slices[item.key()] = tdist::ShardedTensor{item.value(), shape, offsets};
    }
    return slices;
  }
  bool replicated() const override { return false; }
  GPT& model() override { return model_; }

 private:
  GPT model_;
  World world_;
  Tracer& tracer_;
  std::map<std::string, std::vector<int64_t>> full_shapes_;
};
#endif

}  // namespace

ParallelMode resolve_mode(ParallelMode requested, const World& world) {
  if (requested == ParallelMode::kAuto) {
    if (!world.distributed()) return ParallelMode::kSingle;
#ifdef TDIST_GPT_WITH_FSDP
    return ParallelMode::kFsdp;
#else
    return ParallelMode::kDdp;
#endif
  }
  if (requested == ParallelMode::kSingle && world.distributed()) {
    TDIST_THROW(tdist::InvalidArgument,
                "--mode single needs one rank, but WORLD_SIZE=" + std::to_string(world.world_size) +
                    "; use --nproc 1 (or --mode ddp / fsdp)");
  }
#ifndef TDIST_GPT_WITH_FSDP
  if (requested == ParallelMode::kFsdp) {
    TDIST_THROW(tdist::InvalidArgument,
                "--mode fsdp: this gpt was built without tdist::fsdp; use --mode ddp, or rebuild "
                "with the fsdp area (-DTDIST_GPT_WITH_FSDP=ON)");
  }
#endif
  return requested;
}

std::unique_ptr<Parallel> make_parallel(ParallelMode mode, GPT model, const World& world,
                                        Tracer& tracer, bool cpu_offload) {
  (void)tracer;
  TDIST_CHECK_ARG(!cpu_offload || mode == ParallelMode::kFsdp,
                  "--cpu-offload needs --mode fsdp (got " + to_string(mode) +
                      "): only sharded parameters can live on the host");
  switch (mode) {
    case ParallelMode::kSingle:
      return std::make_unique<SingleParallel>(std::move(model));
    case ParallelMode::kDdp:
      if (!world.distributed()) return std::make_unique<SingleParallel>(std::move(model));
#if defined(TDIST_GPT_WITH_DDP)
      return std::make_unique<DdpParallel>(std::move(model));
#elif defined(TDIST_GPT_WITH_COMM)
      return std::make_unique<DdpParallel>(std::move(model), world, tracer);
#else
      TDIST_THROW(tdist::InvalidArgument, "--mode ddp needs tdist::comm in this build");
#endif
    case ParallelMode::kFsdp:
#ifdef TDIST_GPT_WITH_FSDP
      return std::make_unique<FsdpParallel>(std::move(model), world, tracer, cpu_offload);
#else
      TDIST_THROW(tdist::InvalidArgument,
                  "--mode fsdp: this gpt was built without tdist::fsdp; use --mode ddp");
#endif
    case ParallelMode::kAuto:
      break;
  }
  TDIST_THROW(tdist::InvalidArgument, "make_parallel: unresolved mode " + to_string(mode));
}

}  // namespace gpt

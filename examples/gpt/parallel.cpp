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
#include "tdist/detail/fsdp/shard_layout.h"
#include "tdist/fsdp/clip_grad.h"
#include "tdist/fsdp/deferred_init.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/trace.h"
#include "tdist/models/tensor_parallel.h"
#include "tdist/optim/clip_grad.h"
#include "tdist/tensor/dtensor.h"
#include "tdist/tensor/parallel/parallelize.h"
#endif
#include "tdist/models/pretrained.h"

namespace gpt {

ParamGroups split_for_weight_decay(torch::nn::Module& module) {
  ParamGroups groups;
  for (auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    const bool matrix = item.value().dim() >= 2;
    const bool positions = item.key().find("wpe") != std::string::npos;
    (matrix && !positions ? groups.decay : groups.no_decay).push_back(item.value());
  }
  return groups;
}

namespace {

// One process: plain autograd.
class SingleParallel : public Parallel {
 public:
  explicit SingleParallel(Model model) : model_(std::move(model)) {}
  std::string name() const override { return "single"; }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, bool /*sync*/) override {
    return model_->next_token_loss(x, y);
  }
  torch::Tensor forward_eval(const torch::Tensor& idx, tdist::models::KVCache* cache) override {
    return model_->forward(idx, cache);
  }
  void backward(const torch::Tensor& loss) override { loss.backward(); }
  ParamGroups param_groups() override { return split_for_weight_decay(*model_); }
  torch::Tensor clip_grad_norm(double max_norm) override {
    return tdist::optim::clip_grad_norm_(model_->parameters(), max_norm);
  }
  tdist::ShardedStateDict parameter_slices() override {
    tdist::ShardedStateDict slices;
    for (auto& item : model_->named_parameters()) {
      slices[item.key()] = tdist::ShardedTensor::whole(item.value());
    }
    return slices;
  }
  bool replicated() const override { return true; }
  Model& model() override { return model_; }

 protected:
  Model model_;
};

#if defined(TDIST_GPT_WITH_DDP)
// tdist::ddp: replicated model, gradients all-reduced in buckets during backward.
class DDPParallel : public SingleParallel {
 public:
  explicit DDPParallel(Model model)
      : SingleParallel(std::move(model)),
        ddp_(std::make_unique<tdist::ddp::DistributedDataParallel<Model>>(model_)) {}
  std::string name() const override { return "ddp"; }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, bool sync) override {
    no_sync_.reset();
    if (!sync) no_sync_.emplace(ddp_.get());  // held until this micro-step's backward
    return ddp_->forward_method(&tdist::models::CausalLM::next_token_loss, x, y);
  }
  // Evaluation calls the module directly: DDP's pre-forward would arm the reducer for a
  // backward that never comes.
  void backward(const torch::Tensor& loss) override {
    loss.backward();
    no_sync_.reset();
  }

 private:
  std::unique_ptr<tdist::ddp::DistributedDataParallel<Model>> ddp_;
  std::optional<tdist::ddp::DistributedDataParallel<Model>::NoSync> no_sync_;
};
#elif defined(TDIST_GPT_WITH_COMM)
// Without tdist::ddp in the build: the same averaging as one all-reduce of all gradients
// after the last micro-step's backward (no overlap with backward).
class DDPParallel : public SingleParallel {
 public:
  DDPParallel(Model model, const World& world, Tracer& tracer)
      : SingleParallel(std::move(model)), world_(world), tracer_(tracer) {
    torch::NoGradGuard no_grad;
    for (auto& p : model_->parameters()) tdist::broadcast(p.data(), 0);
  }
  std::string name() const override { return "ddp (all-reduce)"; }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, bool sync) override {
    sync_ = sync;
    return model_->next_token_loss(x, y);
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
// torchtitan's apply_fsdp does. Parameters, gradients and AdamW state are 1/N per rank; with
// HSDP, 1/S for a shard group of S = world / replicas ranks, the same on every replica.
class FsdpParallel : public Parallel {
 public:
  FsdpParallel(Model model, const World& world, Tracer& tracer, const ParallelOptions& options,
               const std::function<void(Model&)>& materialize_fn)
      : model_(std::move(model)),
        world_(world),
        tracer_(tracer),
        shard_size_(world.world_size / options.replicas / options.tp),
        shard_rank_(world.rank / static_cast<int>(options.tp) % shard_size_) {
    ensure_process_group(world_);  // FSDP shards over a group, of one at world 1
    // The whole shapes, whether the model arrives sharded (loaded into shards) or not.
    {
      tdist::fsdp::MetaDeviceGuard meta;
      auto whole = tdist::models::build_model(model_->config());
      for (auto& item : whole->named_parameters())
        full_shapes_[item.key()] = item.value().sizes().vec();
    }
    if (tracer_.enabled()) {
      // FSDP's all-gather / reduce-scatter phases go on the trace's communication row.
      const int64_t origin_ns = tracer_.origin_ns();
      tdist::fsdp::set_span_callback([this, origin_ns](const tdist::fsdp::Span& span) {
        tracer_.add_span(span.name, "fsdp", (span.begin_ns - origin_ns) / 1000,
                         (span.end_ns - origin_ns) / 1000, /*tid=*/1);
      });
    }
    if (options.tp > 1) {
      apply_tensor_parallel(options, materialize_fn);
      return;
    }
    if (!tdist::fsdp::is_fully_sharded(*model_)) {
      tdist::models::fully_shard_model(model_, fsdp_options(world, options));
    }
    if (materialize_fn) materialize_fn(model_);
  }
  ~FsdpParallel() override {
    if (tracer_.enabled()) tdist::fsdp::set_span_callback(nullptr);
  }
  std::string name() const override { return shard_size_ == world_.world_size ? "fsdp" : "hsdp"; }
  // FSDP reduce-scatters on every backward; accumulation adds the reduced shards.
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, bool /*sync*/) override {
    return tdist::fsdp::forward_method(model_, &tdist::models::CausalLM::next_token_loss, x, y);
  }
  torch::Tensor forward_eval(const torch::Tensor& idx, tdist::models::KVCache* cache) override {
    return tdist::fsdp::forward(model_, idx, cache);
  }
  void backward(const torch::Tensor& loss) override { loss.backward(); }
  ParamGroups param_groups() override { return split_for_weight_decay(*model_); }
  torch::Tensor clip_grad_norm(double max_norm) override {
    // The whole model's norm: the shards' partial norms summed over each shard group only
    // (under HSDP the replicas hold the same shards).
    return tdist::fsdp::clip_grad_norm_(*model_, max_norm);
  }
  tdist::ShardedStateDict parameter_slices() override {
    // Note [Dim-0 padding] (tdist/detail/fsdp/shard_layout.h): shard rank r owns rows
    // [row_offset, row_offset + local_rows) of each parameter. HSDP's replicas describe the
    // same slices; the checkpoint writes each once. Under tensor parallelism FSDP shards this
    // rank's tensor-parallel part, whose offset in the whole tensor comes first.
    tdist::ShardedStateDict slices;
    for (auto& item : model_->named_parameters()) {
      const auto& full = full_shapes_.at(item.key());
      std::vector<int64_t> shape = full;
      std::vector<int64_t> offsets(full.size(), 0);
      if (const auto tp = tdist::tensor::parallel::parameter_placement(item.value())) {
        std::tie(shape, offsets) =
            tdist::tensor::compute_local_shape_and_global_offset(full, tp->mesh, tp->placements);
      }
      auto layout = tdist::fsdp::ShardLayout::compute(shape, shard_size_, shard_rank_);
      TDIST_CHECK_ARG(item.value().numel() == layout.local_numel(),
                      "gpt fsdp: parameter " + item.key() + " holds " +
                          std::to_string(item.value().numel()) + " elements on rank " +
                          std::to_string(world_.rank) + ", expected its unpadded shard of " +
                          std::to_string(layout.local_numel()));
      if (!offsets.empty()) offsets[0] += layout.row_offset;
      slices[item.key()] = tdist::ShardedTensor{item.value(), full, offsets};
    }
    return slices;
  }
  bool replicated() const override { return false; }
  Model& model() override { return model_; }

 private:
  // --tp: the whole model on every rank first (tensor parallelism distributes rank 0's
  // weights), then torchtitan's plan over "tp", then FSDP over "dp".
  void apply_tensor_parallel(const ParallelOptions& options,
                             const std::function<void(Model&)>& materialize_fn) {
    TDIST_CHECK_ARG(options.replicas == 1,
                    "--tp with --mode hsdp is not provided by the trainer; use --mode fsdp");
    TDIST_CHECK_ARG(!tdist::fsdp::is_fully_sharded(*model_),
                    "gpt fsdp: --tp needs the whole model before sharding (load it unsharded)");
    if (materialize_fn) materialize_fn(model_);
    const auto mesh =
        tdist::mesh::init_device_mesh(world_.device.is_cuda() ? "cuda" : "cpu",
                                      {world_.world_size / options.tp, options.tp}, {"dp", "tp"});
    tdist::models::apply_tensor_parallel(model_, mesh["tp"]);
    tdist::models::fully_shard_model(model_, fsdp_options(world_, options).mesh(mesh["dp"]));
  }

  Model model_;
  World world_;
  Tracer& tracer_;
  int shard_size_, shard_rank_;  // the mesh (replicas, shard_size_) is row-major over ranks
  std::map<std::string, std::vector<int64_t>> full_shapes_;
};
#endif

}  // namespace

ParallelMode resolve_mode(ParallelMode requested, const World& world) {
  if (requested == ParallelMode::kAuto) {
    if (!world.distributed()) return ParallelMode::kSingle;
#ifdef TDIST_GPT_WITH_FSDP
    return ParallelMode::kFSDP;
#else
    return ParallelMode::kDDP;
#endif
  }
  if (requested == ParallelMode::kSingle && world.distributed()) {
    TDIST_THROW(tdist::InvalidArgument,
                "--mode single needs one rank, but WORLD_SIZE=" + std::to_string(world.world_size) +
                    "; use --nproc 1 (or --mode ddp / fsdp)");
  }
  if (requested == ParallelMode::kHSDP && !world.distributed()) {
    TDIST_THROW(tdist::InvalidArgument,
                "--mode hsdp needs several ranks (replica groups of shards); use --nproc 4 or "
                "--mode single");
  }
#ifndef TDIST_GPT_WITH_FSDP
  if (requested == ParallelMode::kFSDP || requested == ParallelMode::kHSDP) {
    TDIST_THROW(tdist::InvalidArgument,
                "--mode fsdp: this gpt was built without tdist::fsdp; use --mode ddp, or rebuild "
                "with the fsdp area (-DTDIST_GPT_WITH_FSDP=ON)");
  }
#endif
  return requested;
}

int64_t resolve_replicas(int64_t requested, const World& world) {
  const int64_t nodes = world.local_world_size > 0 ? world.world_size / world.local_world_size : 1;
  const int64_t replicas = requested > 0 ? requested : nodes > 1 ? nodes : 2;
  TDIST_CHECK_ARG(replicas >= 2 && world.world_size % replicas == 0,
                  "--mode hsdp: --replicas " + std::to_string(replicas) +
                      " must be >= 2 and divide the world size " +
                      std::to_string(world.world_size) +
                      " (each replica group shards the model over world / replicas ranks); "
                      "pick --replicas among the divisors, or --mode fsdp");
  return replicas;
}

tdist::fsdp::FullyShardOptions fsdp_options(const World& world, const ParallelOptions& options) {
  tdist::fsdp::FullyShardOptions fsdp;
#ifdef TDIST_GPT_WITH_FSDP
  // HSDP: shard along the mesh's second dimension, all-reduce gradients along its first.
  if (options.replicas > 1) {
    fsdp.mesh(tdist::mesh::init_device_mesh(world.device.is_cuda() ? "cuda" : "cpu",
                                            {options.replicas, world.world_size / options.replicas},
                                            {"replicate", "shard"}));
  }
  // --cpu-offload: shards, gradients and AdamW state in host memory (page-locked for CUDA).
  if (options.cpu_offload) {
    fsdp.offload_policy(tdist::fsdp::CPUOffloadPolicy(/*pin_memory=*/world.device.is_cuda()));
  }
  // --mixed-precision bf16: FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32).
  if (options.bf16) {
    fsdp.mp_policy(tdist::fsdp::MixedPrecisionPolicy()
                       .param_dtype(torch::kBFloat16)
                       .reduce_dtype(torch::kFloat32));
  }
#else
  (void)world;
  (void)options;
#endif
  return fsdp;
}

std::unique_ptr<Parallel> make_parallel(ParallelMode mode, Model model, const World& world,
                                        Tracer& tracer, const ParallelOptions& options,
                                        const std::function<void(Model&)>& materialize_fn) {
  (void)tracer;
  const bool cpu_offload = options.cpu_offload;
  const bool sharded = mode == ParallelMode::kFSDP || mode == ParallelMode::kHSDP;
  if (!sharded && materialize_fn) materialize_fn(model);
  TDIST_CHECK_ARG(!cpu_offload || sharded, "--cpu-offload needs --mode fsdp or hsdp (got " +
                                               to_string(mode) +
                                               "): only sharded parameters can live on the host");
  switch (mode) {
    case ParallelMode::kSingle:
      return std::make_unique<SingleParallel>(std::move(model));
    case ParallelMode::kDDP:
      if (!world.distributed()) return std::make_unique<SingleParallel>(std::move(model));
#if defined(TDIST_GPT_WITH_DDP)
      return std::make_unique<DDPParallel>(std::move(model));
#elif defined(TDIST_GPT_WITH_COMM)
      return std::make_unique<DDPParallel>(std::move(model), world, tracer);
#else
      TDIST_THROW(tdist::InvalidArgument, "--mode ddp needs tdist::comm in this build");
#endif
    case ParallelMode::kFSDP:
    case ParallelMode::kHSDP:
#ifdef TDIST_GPT_WITH_FSDP
      return std::make_unique<FsdpParallel>(std::move(model), world, tracer, options,
                                            materialize_fn);
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

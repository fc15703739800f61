#include "tdist/fsdp/deferred_init.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/nn/module.h>

#include "fsdp/fsdp_state.h"
#include "fsdp/group_builder.h"
#include "fsdp/registry.h"
#include "tdist/detail/util/torch_compat.h"
#include "tdist/error.h"
#include "tdist/fsdp/fully_shard.h"

namespace tdist::fsdp {

// Factory functions (empty, zeros, ...) take no tensor to dispatch on: BackendSelect picks
// the kernel from their TensorOptions, so it is excluded here and the Meta key included;
// every op on this thread then runs its meta kernel. The whole thread-local key set is
// restored at the end (removing a per-backend key from it again would leave its backend bit).
MetaDeviceGuard::MetaDeviceGuard() : saved_(c10::impl::tls_local_dispatch_key_set()) {
  c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Meta, true);
  c10::impl::tls_set_dispatch_key_excluded(c10::DispatchKey::BackendSelect, true);
}

MetaDeviceGuard::~MetaDeviceGuard() {
  c10::impl::_force_tls_local_dispatch_key_set(saved_);
}

namespace {

// ---- per-module seeds -------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t module_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the module's name
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  const uint64_t mixed = splitmix64(seed ^ splitmix64(h));
  // The CPU generator (mt19937) keeps 32 bits of its seed: fold the other 32 in.
  return (mixed ^ (mixed >> 32)) & 0xffffffffULL;
}

// The default generators init functions draw from (CPU, and the device's when it has its
// own), their states saved on construction and restored on destruction, so deferred init
// leaves the program's random stream where it was.
class SeededGenerators {
 public:
  explicit SeededGenerators(const c10::Device& device) {
    devices_.emplace_back(c10::kCPU);
    if (!device.is_cpu() && !device.is_meta()) devices_.push_back(device);
    for (const c10::Device& d : devices_) saved_.push_back(util::generator_state(d));
  }
  ~SeededGenerators() {
    for (size_t i = 0; i < devices_.size(); ++i) util::set_generator_state(devices_[i], saved_[i]);
  }
  SeededGenerators(const SeededGenerators&) = delete;
  SeededGenerators& operator=(const SeededGenerators&) = delete;

  void seed(uint64_t seed) {
    for (const c10::Device& d : devices_) {
      at::Generator g = at::globalContext().defaultGenerator(d);
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_current_seed(seed);
    }
  }

 private:
  std::vector<c10::Device> devices_;
  std::vector<at::Tensor> saved_;
};

// ---- one module's tensors ---------------------------------------------------------------

struct DirectTensor {
  std::string name;  // within its module
  at::Tensor tensor;
};

// The parameters and buffers `module` holds itself (not its submodules').
std::vector<DirectTensor> direct_tensors(const torch::nn::Module& module) {
  std::vector<DirectTensor> out;
  for (const auto& item : module.named_parameters(/*recurse=*/false)) {
    if (item.value().defined()) out.push_back({item.key(), item.value()});
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    if (item.value().defined()) out.push_back({item.key(), item.value()});
  }
  return out;
}

std::string qualified(const std::string& module, const std::string& tensor) {
  return module.empty() ? tensor : module + "." + tensor;
}

bool can_hold_nan(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type());
}

// What init_fn starts from: NaN in floating tensors (so one it leaves shows), 0 elsewhere.
void poison(const at::Tensor& t) {
  if (can_hold_nan(t)) {
    t.fill_(std::numeric_limits<double>::quiet_NaN());
  } else {
    t.zero_();
  }
}

// In chunks: a whole-tensor isnan() would hold a byte per element of the module's largest
// tensor on top of it.
bool holds_nan(const at::Tensor& t) {
  constexpr int64_t kChunk = 1 << 20;
  const at::Tensor flat = t.reshape({-1});
  for (int64_t start = 0; start < flat.numel(); start += kChunk) {
    if (flat.narrow(0, start, std::min(kChunk, flat.numel() - start)).isnan().any().item<bool>()) {
      return true;
    }
  }
  return false;
}

void check_initialised(const std::string& module_name, const torch::nn::Module& module,
                       const std::vector<DirectTensor>& tensors) {
  for (const auto& [name, t] : tensors) {
    if (can_hold_nan(t) && holds_nan(t)) {
      TDIST_THROW(InvalidArgument,
                  "deferred init: '" + qualified(module_name, name) + "' of module '" +
                      module_name + "' (" + module.name() +
                      ") still holds NaN after its init_fn ran; the init_fn must set every "
                      "parameter and buffer the module holds directly");
    }
  }
}

// Tensors shared by two modules (tied weights) would be initialised twice, the second time
// as part of a module whose shapes it may not fit; refused rather than guessed.
void check_not_shared(std::unordered_map<const c10::TensorImpl*, std::string>& owner,
                      const std::string& module_name, const std::vector<DirectTensor>& tensors) {
  for (const auto& [name, t] : tensors) {
    auto [it, inserted] = owner.emplace(t.unsafeGetTensorImpl(), qualified(module_name, name));
    if (!inserted) {
      TDIST_THROW(InvalidArgument,
                  "deferred init: '" + qualified(module_name, name) + "' is the same tensor as '" +
                      it->second +
                      "' (tied weights); each tensor must belong to one module. Use the "
                      "first module's tensor directly in forward instead of registering it twice");
    }
  }
}

void run_init(const ModuleInitFn& init_fn, SeededGenerators& generators, uint64_t seed,
              const std::string& name, torch::nn::Module& module,
              const std::vector<DirectTensor>& tensors) {
  at::NoGradGuard no_grad;
  for (const auto& t : tensors) poison(t.tensor);
  generators.seed(module_seed(seed, name));
  if (init_fn) {
    init_fn(name, module);
  } else {
    reset_builtin_parameters(name, module);
  }
  check_initialised(name, module, tensors);
}

// A CPU tensor whose pages come straight from the kernel and go back to it when the tensor
// is freed. A full parameter lives only until its module's shards are cut from it; from
// malloc, those tens of megabytes per module would stay resident after free (its mmap
// threshold rises to the size of what was freed, and later ones come from the heap), and
// the peak of materialize would grow with the model's depth instead of its largest module.
at::Tensor mapped_empty(c10::IntArrayRef sizes, const at::TensorOptions& options) {
  const size_t nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) *
                        c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  if (nbytes < (size_t{1} << 20)) return at::empty(sizes, options.device(c10::kCPU));
  void* data = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    TDIST_THROW(Error, "deferred init: mapping " + std::to_string(nbytes) +
                           " bytes for a full parameter failed: " + std::strerror(errno));
  }
  return at::from_blob(
      data, sizes, [nbytes](void* p) { munmap(p, nbytes); }, options.device(c10::kCPU));
}

// Gives meta tensor `t` storage on `device` in place: module members, the parameter dict and
// an optimizer built already all hold this TensorImpl. (Tensor::set_data refuses a meta to
// dense change; the TensorImpl's own shallow copy makes it, keeping autograd metadata.)
void allocate_in_place(const at::Tensor& t, const c10::Device& device, bool transient) {
  at::Tensor storage = transient && device.is_cpu()
                           ? mapped_empty(t.sizes(), t.options())
                           : at::empty(t.sizes(), t.options().device(device));
  t.unsafeGetTensorImpl()->shallow_copy_from(storage.getIntrusivePtr());
}

// Undoes allocate_in_place when the module's init failed, so materialize can be called
// again (with a working init_fn) instead of leaving tensors that hold garbage.
void back_to_meta(const at::Tensor& t) {
  at::Tensor meta = at::empty(t.sizes(), t.options().device(c10::kMeta));
  t.unsafeGetTensorImpl()->shallow_copy_from(meta.getIntrusivePtr());
}

// One materialize call: the groups fully_shard left for it, then each module in turn.
class Materializer {
 public:
  Materializer(torch::nn::Module& model, const MaterializeOptions& options)
      : options_(options), generators_(options.device()) {
    collect_groups(model);
  }

  // Allocates, initialises and (for deferred groups) shards the module's own tensors.
  void materialize_module(const std::string& name, torch::nn::Module& module) {
    std::vector<DirectTensor> tensors = direct_tensors(module);
    bool any_meta = false;
    for (const auto& t : tensors) any_meta = any_meta || t.tensor.is_meta();
    if (!any_meta) return;
    check_not_shared(owner_, name, tensors);
    const bool loading = static_cast<bool>(options_.load_fn());
    std::vector<at::Tensor> allocated = allocate(name, tensors, /*skip_deferred=*/loading);
    try {
      if (loading) {
        load(name, tensors);
      } else {
        run_init(options_.init_fn(), generators_, options_.seed(), name, module, tensors);
      }
    } catch (...) {
      for (const auto& t : allocated) back_to_meta(t);
      throw;
    }
    // Sharded at once: only this module's full parameters are ever held whole.
    for (const auto& t : tensors) {
      auto it = pending_.find(t.tensor.unsafeGetTensorImpl());
      if (it != pending_.end() && !it->second.builder->sharded(it->second.index)) {
        it->second.builder->shard(it->second.index);
      }
    }
  }

  // Hands each deferred state its group; every parameter must have been reached.
  void finish() {
    for (auto& [state, builder] : groups_) {
      for (size_t i = 0; i < builder->size(); ++i) {
        if (!builder->sharded(i)) {
          TDIST_THROW(InvalidArgument, "materialize: a parameter of fully_shard'ed module '" +
                                           state->label() +
                                           "' is not held by any module under the model given");
        }
      }
      state->set_materialized_group(builder->finish(""));
    }
  }

 private:
  struct PendingParam {  // a deferred parameter: its state's builder and its index there
    detail::GroupBuilder* builder;
    size_t index;
  };
  struct PendingGroup {
    detail::FSDPState* state;
    std::unique_ptr<detail::GroupBuilder> builder;
  };

  // MaterializeOptions::load_fn: a deferred parameter's rows go straight into its shard, so
  // no full parameter is ever allocated; every other tensor is allocated whole and loaded.
  void load(const std::string& module_name, const std::vector<DirectTensor>& tensors) {
    at::NoGradGuard no_grad;
    for (const auto& t : tensors) {
      const std::string name = qualified(module_name, t.name);
      const std::vector<int64_t> shape = t.tensor.sizes().vec();
      auto it = pending_.find(t.tensor.unsafeGetTensorImpl());
      if (it == pending_.end()) {
        if (t.tensor.numel() > 0) options_.load_fn()(TensorRows{name, shape, 0, t.tensor});
        continue;
      }
      it->second.builder->shard_in_place(
          it->second.index, [&](const at::Tensor& rows, int64_t row_begin) {
            const at::Tensor target = shape.empty() ? rows.view({}) : rows;
            options_.load_fn()(TensorRows{name, shape, row_begin, target});
          });
    }
  }

  // The deferred groups in module order (the same on every rank, so the collectives their
  // builders issue match), and the parameters other fully_shard calls sharded already.
  void collect_groups(torch::nn::Module& model) {
    for (detail::FSDPState* state : detail::states_under(model)) {
      detail::GroupPlan* plan = state->deferred_group();
      if (plan == nullptr) {
        if (detail::ParamGroup* group = state->group()) {
          for (const auto& p : group->params()) sharded_.insert(p->param().unsafeGetTensorImpl());
        }
        continue;
      }
      auto builder = std::make_unique<detail::GroupBuilder>(*plan, options_.device());
      for (size_t i = 0; i < builder->size(); ++i) {
        pending_[builder->param(i).unsafeGetTensorImpl()] = {builder.get(), i};
      }
      groups_.push_back({state, std::move(builder)});
    }
  }

  // Storage for the module's meta tensors. Tensors holding data beside them were made from
  // literal values under the guard (torch::tensor does not dispatch), e.g. BatchNorm's
  // num_batches_tracked: whole, and initialised with the rest. A shard is not whole: refused.
  std::vector<at::Tensor> allocate(const std::string& name,
                                   const std::vector<DirectTensor>& tensors, bool skip_deferred) {
    std::vector<at::Tensor> allocated;
    for (const auto& t : tensors) {
      TDIST_CHECK_ARG(sharded_.count(t.tensor.unsafeGetTensorImpl()) == 0,
                      "materialize: module '" + name + "' holds meta tensors and '" +
                          qualified(name, t.name) +
                          "', a parameter another fully_shard call has sharded already; build "
                          "the whole model under MetaDeviceGuard");
      if (!t.tensor.is_meta()) continue;
      const bool transient = pending_.count(t.tensor.unsafeGetTensorImpl()) != 0;
      if (transient && skip_deferred) continue;
      allocate_in_place(t.tensor, options_.device(), transient);
      allocated.push_back(t.tensor);
    }
    return allocated;
  }

  const MaterializeOptions& options_;
  SeededGenerators generators_;
  std::vector<PendingGroup> groups_;
  std::unordered_map<const c10::TensorImpl*, PendingParam> pending_;
  std::unordered_set<const c10::TensorImpl*> sharded_;
  std::unordered_map<const c10::TensorImpl*, std::string> owner_;  // see check_not_shared
};

}  // namespace

void materialize(const std::shared_ptr<torch::nn::Module>& model,
                 const MaterializeOptions& options) {
  TDIST_CHECK_ARG(model != nullptr, "materialize: model is null");
  TDIST_CHECK_ARG(!options.device().is_meta(), "materialize: the device must hold data, not meta");
  Materializer materializer(*model, options);
  for (const auto& item : model->named_modules("", /*include_self=*/true)) {
    materializer.materialize_module(item.key(), *item.value());
  }
  materializer.finish();
}

void init_parameters(const std::shared_ptr<torch::nn::Module>& model,
                     const MaterializeOptions& options) {
  TDIST_CHECK_ARG(model != nullptr, "init_parameters: model is null");
  c10::Device device(c10::kCPU);  // the generator of the device the tensors are on
  for (const auto& p : model->parameters()) {
    if (p.defined() && !p.is_cpu()) device = p.device();
  }
  SeededGenerators generators(device);
  std::unordered_map<const c10::TensorImpl*, std::string> owner;
  for (const auto& item : model->named_modules("", /*include_self=*/true)) {
    const std::string& name = item.key();
    torch::nn::Module& module = *item.value();
    TDIST_CHECK_ARG(!is_fully_sharded(module),
                    "init_parameters: module '" + name +
                        "' is fully_shard'ed already, so it holds shards, not whole tensors; "
                        "call init_parameters before fully_shard (or build on the meta device "
                        "and call materialize)");
    std::vector<DirectTensor> tensors = direct_tensors(module);
    if (tensors.empty()) continue;
    for (const auto& t : tensors) {
      TDIST_CHECK_ARG(!t.tensor.is_meta(), "init_parameters: '" + qualified(name, t.name) +
                                               "' is on the meta device; use materialize");
    }
    check_not_shared(owner, name, tensors);
    run_init(options.init_fn(), generators, options.seed(), name, module, tensors);
  }
}

}  // namespace tdist::fsdp

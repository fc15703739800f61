#pragma once

// tdist::fsdp::forward(module, args...): runs `module->forward(args...)` with FSDP's
// pre-forward (unshard, register post-backward on tensor inputs) and post-forward (reshard,
// register pre-backward on tensor outputs) around it. The one-line change per sharded
// submodule call: `x = block(x)` becomes `x = tdist::fsdp::forward(block, x)`.
//
// Tensor arguments are passed through FSDP's autograd hooks; any other argument is
// forwarded untouched. Outputs may be a Tensor, a std::vector<Tensor>, or a std::tuple /
// std::pair of Tensors and other values.

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace tdist::fsdp {

namespace detail {
class FSDPState;

/// The FSDP state of `module`; throws InvalidArgument when fully_shard was not applied.
FSDPState& state_of(const torch::nn::Module& module);
/// The FSDP state of `module`, or nullptr.
FSDPState* find_state(const torch::nn::Module& module);
/// Hook entry points (see fsdp_state.h); return the tensors to use instead of the given.
std::vector<at::Tensor> run_pre_forward(FSDPState& state, std::vector<at::Tensor> inputs);
std::vector<at::Tensor> run_post_forward(FSDPState& state, std::vector<at::Tensor> outputs);

template <class T>
using is_tensor = std::is_same<std::decay_t<T>, at::Tensor>;

template <class T, std::enable_if_t<is_tensor<T>::value, int> = 0>
void collect(std::vector<at::Tensor>& out, const T& t) {
  out.push_back(t);
}
template <class T, std::enable_if_t<!is_tensor<T>::value, int> = 0>
void collect(std::vector<at::Tensor>&, const T&) {}

template <class T, std::enable_if_t<is_tensor<T>::value, int> = 0>
at::Tensor take(std::vector<at::Tensor>& from, size_t& next, T&&) {
  return std::move(from[next++]);
}
template <class T, std::enable_if_t<!is_tensor<T>::value, int> = 0>
T&& take(std::vector<at::Tensor>&, size_t&, T&& value) {
  return std::forward<T>(value);
}

// Outputs: gather tensors, run the hook, put them back.
template <class T>
struct Outputs {
  static_assert(is_tensor<T>::value,
                "tdist::fsdp::forward: the module's forward must return a Tensor, a "
                "std::vector<Tensor>, or a std::tuple/std::pair of values");
  static void collect(std::vector<at::Tensor>& out, const T& t) { out.push_back(t); }
  static void put_back(std::vector<at::Tensor>& from, size_t& next, T& t) {
    t = std::move(from[next++]);
  }
};
template <>
struct Outputs<std::vector<at::Tensor>> {
  static void collect(std::vector<at::Tensor>& out, const std::vector<at::Tensor>& v) {
    out.insert(out.end(), v.begin(), v.end());
  }
  static void put_back(std::vector<at::Tensor>& from, size_t& next, std::vector<at::Tensor>& v) {
    for (auto& t : v) t = std::move(from[next++]);
  }
};
template <class... Ts>
struct Outputs<std::tuple<Ts...>> {
  static void collect(std::vector<at::Tensor>& out, const std::tuple<Ts...>& t) {
    std::apply([&](const auto&... e) { (detail::collect(out, e), ...); }, t);
  }
  static void put_back(std::vector<at::Tensor>& from, size_t& next, std::tuple<Ts...>& t) {
    std::apply([&](auto&... e) { (put_one(from, next, e), ...); }, t);
  }
  template <class E>
  static void put_one(std::vector<at::Tensor>& from, size_t& next, E& e) {
    if constexpr (is_tensor<E>::value) e = std::move(from[next++]);
  }
};
template <class A, class B>
struct Outputs<std::pair<A, B>> {
  static void collect(std::vector<at::Tensor>& out, const std::pair<A, B>& p) {
    detail::collect(out, p.first);
    detail::collect(out, p.second);
  }
  static void put_back(std::vector<at::Tensor>& from, size_t& next, std::pair<A, B>& p) {
    if constexpr (is_tensor<A>::value) p.first = std::move(from[next++]);
    if constexpr (is_tensor<B>::value) p.second = std::move(from[next++]);
  }
};

/// Calls `call(*module, args...)` through FSDP's pre- and post-forward hooks (forward and
/// forward_method below).
template <class M, class Call, class... Args>
auto call_through_fsdp(M& module, Call&& call, Args&&... args) {
  detail::FSDPState* found =
      detail::find_state(static_cast<const torch::nn::Module&>(*module.get()));
  if (found == nullptr) return call(*module.get(), std::forward<Args>(args)...);
  detail::FSDPState& state = *found;
  std::vector<at::Tensor> inputs;
  (detail::collect(inputs, args), ...);
  inputs = detail::run_pre_forward(state, std::move(inputs));
  size_t next = 0;
  // Braced initialisation evaluates left to right, so tensors are taken in order.
  std::tuple<decltype(detail::take(inputs, next, std::forward<Args>(args)))...> call_args{
      detail::take(inputs, next, std::forward<Args>(args))...};
  auto output =
      std::apply([&](auto&&... a) { return call(*module.get(), std::forward<decltype(a)>(a)...); },
                 std::move(call_args));
  using Out = detail::Outputs<std::decay_t<decltype(output)>>;
  std::vector<at::Tensor> outputs;
  Out::collect(outputs, output);
  outputs = detail::run_post_forward(state, std::move(outputs));
  size_t put = 0;
  Out::put_back(outputs, put, output);
  return output;
}

}  // namespace detail

/// Calls `module->forward(args...)` through FSDP. `module` is a ModuleHolder (e.g. Block)
/// or a std::shared_ptr to the module's Impl. A module fully_shard was not applied to is
/// simply called, so one model source serves sharded and unsharded runs.
template <class M, class... Args>
auto forward(M& module, Args&&... args) {
  return detail::call_through_fsdp(
      module, [](auto& impl, auto&&... a) { return impl.forward(std::forward<decltype(a)>(a)...); },
      std::forward<Args>(args)...);
}

/// FSDP2's register_fsdp_forward_method: calls another method of the module (a generation
/// step, an encoder-only pass) through the same hooks as forward(), so its parameters are
/// unsharded for it and its gradients reduced after backward:
///   `tdist::fsdp::forward_method(model, &GPTImpl::generate_step, ids)`.
template <class M, class Method, class... Args>
auto forward_method(M& module, Method method, Args&&... args) {
  return detail::call_through_fsdp(
      module,
      [method](auto& impl, auto&&... a) { return (impl.*method)(std::forward<decltype(a)>(a)...); },
      std::forward<Args>(args)...);
}

}  // namespace tdist::fsdp

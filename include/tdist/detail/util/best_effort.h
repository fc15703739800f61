#pragma once

// Internal: a call that must not hold up the failure path it serves.
//
// Note [Best-effort store calls]
// Recording or reading a failure in the group's store must not hold up the failure it
// describes. When the rank that hosts the store is the one that died or stopped, a TCPStore
// request waits for the store's whole timeout (minutes): so the call runs on a thread of its
// own, and the caller waits for it at most `budget`, then goes on without it (the thread ends
// with the store's own timeout).

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <thread>

namespace tdist::detail {

/// call()'s value, or nullopt when it threw or took longer than `budget`.
template <typename T>
std::optional<T> best_effort(std::function<T()> call, std::chrono::milliseconds budget) {
  auto result = std::make_shared<std::promise<std::optional<T>>>();
  std::future<std::optional<T>> answer = result->get_future();
  std::thread([call = std::move(call), result] {
    std::optional<T> value;
    try {
      value = call();
    } catch (...) {
    }
    result->set_value(std::move(value));
  }).detach();
  if (answer.wait_for(budget) != std::future_status::ready) return std::nullopt;
  return answer.get();
}

}  // namespace tdist::detail

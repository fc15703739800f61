#pragma once

// Options structs in LibTorch style: TDIST_ARG(int, rank) = -1; gives a chained setter
// `opts.rank(3)`, a getter `opts.rank()` and the member `rank_`. Same shape as TORCH_ARG,
// kept our own so the public headers do not depend on LibTorch's internal macro.

#include <utility>

#define TDIST_ARG(T, name)                                  \
 public:                                                    \
  inline auto name(const T& new_##name)->decltype(*this) {  \
    this->name##_ = new_##name;                             \
    return *this;                                           \
  }                                                         \
  inline auto name(T&& new_##name)->decltype(*this) {       \
    this->name##_ = std::move(new_##name);                  \
    return *this;                                           \
  }                                                         \
  inline const T& name() const noexcept { return this->name##_; } \
  inline T& name() noexcept { return this->name##_; }       \
                                                            \
 private:                                                   \
  T name##_ /* NOLINT */

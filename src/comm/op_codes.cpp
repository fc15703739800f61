#include "tdist/detail/comm/engine/op_codes.h"

#include <array>

namespace tdist::detail {

namespace {

// Append only: the codes are positions, and ranks of one job compare them.
constexpr std::array<const char*, 16> kNames = {nullptr,          "broadcast",
                                                "all_reduce",     "reduce",
                                                "all_gather",     "all_gather_into_tensor",
                                                "gather",         "scatter",
                                                "reduce_scatter", "reduce_scatter_tensor",
                                                "all_to_all",     "all_to_all_single",
                                                "barrier",        "all_reduce_coalesced",
                                                "send",           "recv"};

}  // namespace

int32_t collective_op_code(std::string_view name) {
  for (size_t i = 1; i < kNames.size(); ++i) {
    if (name == kNames[i]) return static_cast<int32_t>(i);
  }
  return 0;
}

const char* collective_op_name(int64_t code) {
  return code > 0 && code < static_cast<int64_t>(kNames.size()) ? kNames[code] : nullptr;
}

}  // namespace tdist::detail

#pragma once

// Collective ops as small integer codes, for the places that send an op across ranks as a
// number: the debug-mode call fingerprint (debug_check.cpp) and the Gloo exchange header
// (gloo/exchange.cpp). One table, so both name an op the same way.

#include <cstdint>
#include <string_view>

namespace tdist::detail {

/// The code of the collective `name` ("all_reduce", "send", ...); 0 when unknown.
int32_t collective_op_code(std::string_view name);

/// The name of a collective's code; nullptr for 0 and for codes no op has.
const char* collective_op_name(int64_t code);

}  // namespace tdist::detail

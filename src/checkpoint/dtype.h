#pragma once

// dtype names as safetensors spells them, shared by checkpoint metadata and safetensors.

#include <string>

#include <c10/core/ScalarType.h>

namespace tdist::checkpoint::detail {

/// Throws CheckpointError for dtypes the formats do not carry (complex, quantized).
std::string dtype_name(c10::ScalarType type);
c10::ScalarType dtype_from_name(const std::string& name, const std::string& where);

}  // namespace tdist::checkpoint::detail

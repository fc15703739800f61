#pragma once

// metadata.json on disk: a checksummed header line, then the JSON (see metadata.h).

#include <string>

#include "tdist/checkpoint/metadata.h"

namespace tdist::checkpoint::detail {

std::string encode_metadata(const CheckpointMetadata& metadata);
/// `path` is only used in error messages.
CheckpointMetadata decode_metadata(const std::string& bytes, const std::string& path);

std::string base64_encode(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> base64_decode(const std::string& text);

}  // namespace tdist::checkpoint::detail

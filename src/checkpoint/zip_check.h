#pragma once

// Checks the CRC-32 of every stored record of a zip archive (a torch.save blob) against its
// central directory. LibTorch's reader does not, so without this a flipped byte in a
// distributed checkpoint's tensor data would load silently.

#include <cstddef>
#include <string>

namespace tdist::checkpoint::detail {

/// Throws CheckpointError naming `where` and the record when the archive is malformed or a
/// record's bytes do not match its CRC. Compressed records (torch.save never writes them)
/// are skipped.
void check_zip_crcs(const void* data, size_t size, const std::string& where);

}  // namespace tdist::checkpoint::detail

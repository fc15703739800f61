#pragma once

// Bandwidth-optimal building blocks over an Exchange: ring reduce-scatter, ring all-gather
// and a pipelined chain broadcast. Chunks are given as pointers (they need not be one
// buffer: the list collectives pass each tensor). Every transfer is split in segments of
// GlooComm::segment_bytes() spread over the channels, and each received segment is reduced
// and forwarded at once, so the reduction of one segment overlaps the transfer of the next.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gloo/exchange.h"
#include "gloo/reduce_ops.h"

namespace tdist::detail {

/// Element counts of `n` near-equal chunks of `numel` elements (the first ones one larger).
std::vector<size_t> even_chunks(size_t numel, int n);

/// Ring reduce-scatter. src[c] is this rank's contribution to chunk c (read only, unless it
/// aliases dst[c]). After the call dst[rank] holds the reduction of chunk `rank` over all ranks.
/// dst[c] for c != rank may be nullptr (internal scratch is used) or memory the caller lets
/// the ring overwrite (e.g. src itself, for an in-place all_reduce).
void ring_reduce_scatter(Exchange& ex, const std::vector<const char*>& src,
                         const std::vector<char*>& dst, const std::vector<size_t>& numel,
                         size_t element_size, const ReduceFn& reduce, uint64_t key_base);

/// Ring all-gather: chunk[rank] holds this rank's data; after the call every chunk[c] holds
/// rank c's data.
void ring_all_gather(Exchange& ex, const std::vector<char*>& chunk,
                     const std::vector<size_t>& bytes, uint64_t key_base);

/// Pipelined chain broadcast from `root` through root+1, root+2, ...
void chain_broadcast(Exchange& ex, char* data, size_t bytes, int root, uint64_t key_base);

}  // namespace tdist::detail

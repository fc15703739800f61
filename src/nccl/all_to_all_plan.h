#pragma once

// all_to_all_single in NCCL's terms: NCCL sends and receives elements, while the split sizes
// count rows along dim 0. Each side converts its rows with its own row width (the product of
// its trailing dimensions), so a rank that sends no rows still receives whole rows. Pure
// arithmetic: its unit tests run on every machine.

#include <cstdint>
#include <vector>

#include <c10/util/ArrayRef.h>

namespace tdist::nccl::detail {

/// Where each peer's block starts in a flat tensor and how many elements it has.
struct PeerBlocks {
  std::vector<int64_t> offset;
  std::vector<int64_t> count;
};

struct AllToAllPlan {
  PeerBlocks send;
  PeerBlocks recv;
};

/// The per-peer element blocks of all_to_all_single on `world` ranks from rank `rank`. Empty
/// split sizes mean dim 0 split evenly (the caller checked it divides). Throws InvalidArgument
/// when the rows of input and output hold different numbers of elements, or when this rank
/// sends itself a different number of elements than it expects from itself.
AllToAllPlan plan_all_to_all_single(c10::IntArrayRef input_sizes, c10::IntArrayRef output_sizes,
                                    const std::vector<int64_t>& input_split_sizes,
                                    const std::vector<int64_t>& output_split_sizes, int world,
                                    int rank);

}  // namespace tdist::nccl::detail

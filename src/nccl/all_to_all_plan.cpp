#include "nccl/all_to_all_plan.h"

#include <string>

#include "tdist/error.h"

namespace tdist::nccl::detail {

namespace {

int64_t rows_of(c10::IntArrayRef sizes) {
  return sizes.empty() ? 1 : sizes[0];
}

/// Elements per row: the product of the trailing dimensions, defined even with no rows.
int64_t row_width(c10::IntArrayRef sizes) {
  int64_t width = 1;
  for (size_t d = 1; d < sizes.size(); ++d) width *= sizes[d];
  return width;
}

PeerBlocks blocks_of(c10::IntArrayRef sizes, const std::vector<int64_t>& splits, int world) {
  const int64_t width = row_width(sizes);
  PeerBlocks out{std::vector<int64_t>(world), std::vector<int64_t>(world)};
  int64_t at = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t rows = splits.empty() ? rows_of(sizes) / world : splits[r];
    out.offset[r] = at;
    out.count[r] = rows * width;
    at += out.count[r];
  }
  return out;
}

}  // namespace

AllToAllPlan plan_all_to_all_single(c10::IntArrayRef input_sizes, c10::IntArrayRef output_sizes,
                                    const std::vector<int64_t>& input_split_sizes,
                                    const std::vector<int64_t>& output_split_sizes, int world,
                                    int rank) {
  const std::string where = "nccl all_to_all_single (rank " + std::to_string(rank) + "): ";
  if (rows_of(input_sizes) > 0 && rows_of(output_sizes) > 0 &&
      row_width(input_sizes) != row_width(output_sizes)) {
    TDIST_THROW(InvalidArgument,
                where + "input rows have " + std::to_string(row_width(input_sizes)) +
                    " elements but output rows have " + std::to_string(row_width(output_sizes)) +
                    "; give both tensors the same trailing dimensions");
  }
  AllToAllPlan plan{blocks_of(input_sizes, input_split_sizes, world),
                    blocks_of(output_sizes, output_split_sizes, world)};
  if (plan.send.count[rank] != plan.recv.count[rank]) {
    TDIST_THROW(InvalidArgument,
                where + "this rank sends itself " + std::to_string(plan.send.count[rank]) +
                    " elements but expects " + std::to_string(plan.recv.count[rank]) +
                    " from itself; the split sizes disagree");
  }
  return plan;
}

}  // namespace tdist::nccl::detail

#pragma once

// Shared helpers of the checkpoint tests: reference tensors, shard layouts, comparisons.

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "tdist/checkpoint/checkpoint.h"

namespace tdist::checkpoint::testing {

/// Full tensors of many dtypes and shapes (0-dim, empty, odd sizes), deterministic by seed.
std::map<std::string, at::Tensor> reference_tensors(int seed);

/// How a test spreads a full tensor over ranks.
enum class Layout {
  kEven,    // dim-0 chunks of ceil(n / world) rows; trailing ranks may get none
  kUneven,  // dim-0 chunks proportional to rank + 1
  kWhole,   // every rank holds the whole tensor
  kDim1,    // split along dim 1 (dim 0 for 1-d tensors)
};
std::string layout_name(Layout layout);

/// rank's slice of `full` under `layout` (a copy, so writes to it never reach `full`).
ShardedTensor make_shard(const at::Tensor& full, int rank, int world, Layout layout);

/// The same layout but filled with a pattern that is surely different from the data.
ShardedTensor make_empty_shard(const at::Tensor& full, int rank, int world, Layout layout);

ShardedStateDict shard_all(const std::map<std::string, at::Tensor>& full, int rank, int world,
                           Layout layout, bool empty);

/// Same dtype, shape and bytes (NaN-safe).
bool bitwise_equal(const at::Tensor& a, const at::Tensor& b);

/// Expects every shard in `state` equal, bitwise, to its box of `full`.
void expect_matches_full(const ShardedStateDict& state,
                         const std::map<std::string, at::Tensor>& full, const std::string& what);

/// Runs fn on world threads, each with its own StoreCoordinator on one shared store.
/// The coordinators time out after `timeout`.
void run_with_coordinators(int world, const std::function<void(int rank, CoordinatorPtr)>& fn,
                           std::chrono::milliseconds timeout = std::chrono::seconds(20));

/// Every (N, M) in 1..4 x 1..4: saves `full` at world N (rank r's ExtraState::step = 100 + r)
/// with `save_options(coordinator)`, in a layout cycling through even, uneven, whole, dim-1,
/// and loads it at world M in a layout cycling through `load_layouts`. Expects every shard
/// bitwise, the saved world size, and at the same world size each rank's own extra state
/// (rank 0's otherwise).
void expect_reshards_every_world_pair(
    const std::map<std::string, at::Tensor>& full,
    const std::function<SaveOptions(CoordinatorPtr)>& save_options,
    const std::vector<Layout>& load_layouts);

/// Flips one bit of the byte at `offset` of `path`.
void flip_byte(const std::string& path, int64_t offset);

/// Path of the only file in dir whose name starts with prefix ("" if none or several).
std::string find_file(const std::string& dir, const std::string& prefix);

/// Names of the entries of dir.
std::vector<std::string> list_dir(const std::string& dir);

}  // namespace tdist::checkpoint::testing

#pragma once

// What the checkpoint benchmarks share: the state they save (float32 matrices of 1024
// columns, split by rows as FSDP splits them) and ranks as threads agreeing through one
// HashStore.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "tdist/checkpoint/coordinator.h"
#include "tdist/detail/util/sharded_tensor.h"
#include "tdist/store/hash_store.h"

namespace bench {

/// `tensors` float32 matrices of 1024 columns, `mib` MiB in all, drawn after seeding `seed`.
inline std::vector<at::Tensor> make_full_tensors(int64_t mib, int tensors, uint64_t seed) {
  const int64_t cols = 1024;
  const int64_t rows = std::max<int64_t>(1, mib * (1 << 20) / 4 / cols / tensors);
  at::manual_seed(seed);
  std::vector<at::Tensor> out;
  for (int i = 0; i < tensors; ++i) out.push_back(at::randn({rows, cols}));
  return out;
}

/// This rank's dim-0 slice of every tensor (FSDP's even split) as "model.t<i>", a copy or
/// zeros.
inline tdist::ShardedStateDict shard_rows(const std::vector<at::Tensor>& full, int rank, int world,
                                          bool zeros = false) {
  tdist::ShardedStateDict out;
  for (size_t i = 0; i < full.size(); ++i) {
    const int64_t rows = full[i].size(0);
    const int64_t per = (rows + world - 1) / world;
    const int64_t begin = std::min(rows, per * rank), end = std::min(rows, begin + per);
    at::Tensor piece = full[i].narrow(0, begin, end - begin);
    out["model.t" + std::to_string(i)] = tdist::ShardedTensor{
        zeros ? at::zeros_like(piece) : piece.clone(), full[i].sizes().vec(), {begin, 0}};
  }
  return out;
}

/// Runs fn on `world` threads, each with a coordinator over one fresh HashStore; wall seconds.
inline double on_ranks(int world,
                       const std::function<void(int, tdist::checkpoint::CoordinatorPtr)>& fn) {
  static int round = 0;
  auto store = std::make_shared<tdist::HashStore>();
  const std::string prefix = "bench" + std::to_string(round++);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      fn(r, std::make_shared<tdist::checkpoint::StoreCoordinator>(store, r, world, prefix));
    });
  }
  for (auto& t : threads) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace bench

// bench_async_save: how long an asynchronous save stops training (the time save() takes to
// stage the state into host memory and return) beside a synchronous save of the same
// sharded state, ranks as threads agreeing through one HashStore. The first async save
// allocates its staging memory; later ones copy into the same buffers ("steady"). Every
// state is changed right after save() returns, and every async checkpoint is loaded back
// and compared bitwise with the state as it was (#wrong). Beside them, each rank copy_'s its
// state into buffers of its own: the staging copy before Note [Streaming staging copies].
//   bench_async_save [--mib 256] [--tensors 16] [--world 2] [--rounds 5] [--fsync 1]
//                    [--dir <parent of the checkpoints>]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "sharded_state.h"
#include "tdist/checkpoint/async_save.h"

namespace ckpt = tdist::checkpoint;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int64_t mib = 256;
  int tensors = 16;
  int world = 2;
  int rounds = 5;
  bool fsync = true;
  std::string dir = fs::temp_directory_path().string();
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mib") {
      a.mib = std::stoll(v);
    } else if (k == "--tensors") {
      a.tensors = std::stoi(v);
    } else if (k == "--world") {
      a.world = std::stoi(v);
    } else if (k == "--rounds") {
      a.rounds = std::stoi(v);
    } else if (k == "--fsync") {
      a.fsync = v != "0";
    } else if (k == "--dir") {
      a.dir = v;
    } else {
      std::cerr << "bench_async_save: unknown option " << k << "\n";
      std::exit(2);
    }
  }
  if (a.rounds < 2 || a.world < 1 || a.mib < 1 || a.tensors < 1) {
    std::cerr << "bench_async_save: needs --rounds >= 2, --world >= 1, --mib >= 1\n";
    std::exit(2);
  }
  return a;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Loads dir at world 1 and counts tensors that differ from `full`.
int64_t wrong_tensors(const std::string& dir, const std::vector<at::Tensor>& full) {
  tdist::ShardedStateDict target = bench::shard_rows(full, 0, 1);
  for (auto& [name, st] : target) st.local.zero_();
  ckpt::load(target, dir,
             ckpt::LoadOptions().coordinator(std::make_shared<ckpt::LocalCoordinator>()));
  int64_t wrong = 0;
  for (size_t i = 0; i < full.size(); ++i)
    wrong += !target.at("model.t" + std::to_string(i)).local.equal(full[i]);
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  std::vector<at::Tensor> full = bench::make_full_tensors(a.mib, a.tensors, 3);
  int64_t total = 0;
  for (const auto& t : full) total += t.nbytes();
  std::printf(
      "# %d float32 tensors, %.1f MiB in all, world %d (ranks are threads); fsync %s; "
      "%d rounds\n",
      a.tensors, total / 1048576.0, a.world, a.fsync ? "on" : "off", a.rounds);

  std::vector<std::unique_ptr<ckpt::AsyncCheckpointer>> checkpointers;
  for (int r = 0; r < a.world; ++r) {
    checkpointers.push_back(std::make_unique<ckpt::AsyncCheckpointer>());
  }
  std::vector<double> sync_s, stall_s, async_total_s, plain_copy_s;
  // The reference beside the stall: each rank copy_'s its state into buffers of its own, as
  // staging did before Note [Streaming staging copies].
  std::vector<std::vector<at::Tensor>> plain_buffers(a.world);
  int64_t wrong = 0;
  for (int round = 0; round < a.rounds; ++round) {
    const std::string base = (fs::path(a.dir) / "bench_async_save").string();
    fs::remove_all(base);
    std::vector<tdist::ShardedStateDict> states;
    for (int r = 0; r < a.world; ++r) states.push_back(bench::shard_rows(full, r, a.world));

    const auto t_sync = Clock::now();
    bench::on_ranks(a.world, [&](int rank, ckpt::CoordinatorPtr c) {
      ckpt::save(states[rank], {}, base + "/sync",
                 ckpt::SaveOptions().coordinator(c).fsync(a.fsync));
    });
    sync_s.push_back(seconds_since(t_sync));

    std::vector<double> stalls(a.world);
    const auto t_async = Clock::now();
    bench::on_ranks(a.world, [&](int rank, ckpt::CoordinatorPtr c) {
      const auto t0 = Clock::now();
      const ckpt::SaveFuture future = checkpointers[rank]->save(
          states[rank], {}, base + "/async", ckpt::SaveOptions().coordinator(c).fsync(a.fsync));
      stalls[rank] = seconds_since(t0);
      for (auto& [name, st] : states[rank]) st.local.add_(1.0);  // training goes on
      future.wait();
    });
    async_total_s.push_back(seconds_since(t_async));
    stall_s.push_back(*std::max_element(stalls.begin(), stalls.end()));
    wrong += wrong_tensors(base + "/async", full);

    std::vector<double> copies(a.world);
    std::vector<int64_t> copies_wrong(a.world);
    bench::on_ranks(a.world, [&](int rank, ckpt::CoordinatorPtr) {
      auto& buffers = plain_buffers[rank];
      if (buffers.empty()) {
        for (auto& [name, st] : states[rank]) buffers.push_back(at::empty_like(st.local));
      }
      const auto t0 = Clock::now();
      size_t i = 0;
      for (auto& [name, st] : states[rank]) buffers[i++].copy_(st.local);
      copies[rank] = seconds_since(t0);
      i = 0;
      for (auto& [name, st] : states[rank]) copies_wrong[rank] += !buffers[i++].equal(st.local);
    });
    for (const int64_t w : copies_wrong) wrong += w;
    plain_copy_s.push_back(*std::max_element(copies.begin(), copies.end()));
    fs::remove_all(base);
  }

  const double sync = median(sync_s);
  const double steady = median(std::vector<double>(stall_s.begin() + 1, stall_s.end()));
  std::printf("%-28s %10s %10s\n", "", "ms", "x_sync");
  std::printf("%-28s %10.1f %10.3f\n", "sync save (median)", sync * 1e3, 1.0);
  std::printf("%-28s %10.1f %10.3f\n", "async stall, first save", stall_s[0] * 1e3,
              stall_s[0] / sync);
  std::printf("%-28s %10.1f %10.3f\n", "async stall, steady (median)", steady * 1e3, steady / sync);
  std::printf("%-28s %10.1f %10.3f\n", "async save to commit (median)", median(async_total_s) * 1e3,
              median(async_total_s) / sync);
  const double plain = median(std::vector<double>(plain_copy_s.begin() + 1, plain_copy_s.end()));
  std::printf("%-28s %10.1f %10.3f\n", "copy_ of the state (median)", plain * 1e3, plain / sync);
  std::printf("#stall_over_sync %.4f\n#stall_over_copy_ %.3f\n#wrong %lld\n", steady / sync,
              steady / plain, (long long)wrong);
  return wrong == 0 ? 0 : 1;
}

// bench_checkpoint: save and load time of one sharded state in tdist's checkpoint format and
// in PyTorch's distributed checkpoint format (both written and read by tdist), ranks as
// threads agreeing through one HashStore, beside Python's own dcp.save / dcp.load of the
// same tensors in one process. Every load is checked bitwise against what was saved
// (#wrong); "resharded" loads at world + 1, so each rank reads parts of other ranks' slices;
// "unverified" loads with LoadOptions::verify off (no CRC32C blocks / zip CRC-32 checked).
//   bench_checkpoint [--mib 256] [--tensors 16] [--worlds 1,2] [--rounds 3] [--fsync 1]
//                    [--dir <parent of the checkpoints>] [--python <python with torch>]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "sharded_state.h"
#include "tdist/checkpoint/checkpoint.h"

namespace ckpt = tdist::checkpoint;
namespace fs = std::filesystem;

namespace {

struct Args {
  int64_t mib = 256;
  int tensors = 16;
  std::vector<int> worlds = {1, 2};
  int rounds = 3;
  bool fsync = true;
  std::string dir = fs::temp_directory_path().string();
  std::string python = TDIST_PYTHON;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mib") {
      a.mib = std::stoll(v);
    } else if (k == "--tensors") {
      a.tensors = std::stoi(v);
    } else if (k == "--rounds") {
      a.rounds = std::stoi(v);
    } else if (k == "--fsync") {
      a.fsync = v != "0";
    } else if (k == "--dir") {
      a.dir = v;
    } else if (k == "--python") {
      a.python = v;
    } else if (k == "--worlds") {
      a.worlds.clear();
      std::stringstream ss(v);
      for (std::string w; std::getline(ss, w, ',');) a.worlds.push_back(std::stoi(w));
    } else {
      std::cerr << "bench_checkpoint: unknown option " << k << "\n";
      std::exit(2);
    }
  }
  return a;
}

int64_t wrong_tensors(const tdist::ShardedStateDict& state, const std::vector<at::Tensor>& full) {
  int64_t wrong = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    const auto& st = state.at("model.t" + std::to_string(i));
    wrong += !st.local.equal(full[i].narrow(0, st.offsets[0], st.local.size(0)));
  }
  return wrong;
}

int64_t directory_bytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) total += static_cast<int64_t>(e.file_size());
  }
  return total;
}

struct Timing {
  double save = 1e30, load = 1e30, resharded = 1e30, unverified = 1e30;
  int64_t bytes = 0, wrong = 0;
};

Timing measure(const Args& a, const std::vector<at::Tensor>& full, int world,
               ckpt::CheckpointFormat format) {
  Timing t;
  for (int round = 0; round < a.rounds; ++round) {
    const std::string dir = (fs::path(a.dir) / ("bench_checkpoint_" + ckpt::to_string(format) +
                                                "_w" + std::to_string(world)))
                                .string();
    fs::remove_all(dir);
    t.save =
        std::min(t.save, bench::on_ranks(world, [&](int rank, ckpt::CoordinatorPtr c) {
                   ckpt::save(bench::shard_rows(full, rank, world, false), {}, dir,
                              ckpt::SaveOptions().coordinator(c).fsync(a.fsync).format(format));
                 }));
    t.bytes = directory_bytes(dir);
    struct Load {
      int world;
      bool verify;
      double* best;
    };
    for (const Load& l : {Load{world, true, &t.load}, Load{world + 1, true, &t.resharded},
                          Load{world, false, &t.unverified}}) {
      std::vector<tdist::ShardedStateDict> targets;
      for (int r = 0; r < l.world; ++r)
        targets.push_back(bench::shard_rows(full, r, l.world, true));
      const double seconds = bench::on_ranks(l.world, [&](int rank, ckpt::CoordinatorPtr c) {
        ckpt::load(targets[rank], dir, ckpt::LoadOptions().coordinator(c).verify(l.verify));
      });
      for (int r = 0; r < l.world; ++r) t.wrong += wrong_tensors(targets[r], full);
      *l.best = std::min(*l.best, seconds);
    }
    fs::remove_all(dir);
  }
  return t;
}

/// Python's dcp.save / dcp.load of the same sizes: {save ms, load ms}, or {-1, -1}.
std::pair<double, double> python_dcp(const Args& a, bool* ok) {
  const std::string out = (fs::path(a.dir) / "bench_checkpoint_python.txt").string();
  const std::string cmd = a.python + " " + TDIST_BENCH_CKPT_PY + " " + std::to_string(a.mib) + " " +
                          std::to_string(a.tensors) + " " + std::to_string(a.rounds) + " " + a.dir +
                          " >" + out + " 2>&1";
  *ok = false;
  if (std::system(cmd.c_str()) != 0) return {-1, -1};
  FILE* f = std::fopen(out.c_str(), "r");
  char tag[16] = {};
  double save = -1, load = -1;
  int good = 0;
  const bool parsed = f && std::fscanf(f, "%15s %lf %lf %d", tag, &save, &load, &good) == 4;
  if (f) std::fclose(f);
  *ok = parsed && good == 1;
  return parsed ? std::make_pair(save, load) : std::make_pair(-1.0, -1.0);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const auto full = bench::make_full_tensors(a.mib, a.tensors, 1);
  int64_t total = 0;
  for (const auto& t : full) total += t.nbytes();
  std::printf(
      "# %d float32 tensors, %.1f MiB in all; fsync %s; best of %d rounds; ranks are "
      "threads; resharded = loaded at world + 1; unverified = checksums off\n",
      a.tensors, total / 1048576.0, a.fsync ? "on" : "off", a.rounds);
  std::printf("%6s  %-10s %10s %10s %8s %10s\n", "world", "op", "tdist_ms", "dcp_ms", "dcp_x",
              "tdist_GB/s");
  int64_t wrong = 0;
  double dcp_save_w1 = -1, dcp_load_w1 = -1;
  for (int world : a.worlds) {
    const Timing td = measure(a, full, world, ckpt::CheckpointFormat::kTdist);
    const Timing dc = measure(a, full, world, ckpt::CheckpointFormat::kDCP);
    wrong += td.wrong + dc.wrong;
    const struct {
      const char* op;
      double tdist, dcp;
    } rows[] = {{"save", td.save, dc.save},
                {"load", td.load, dc.load},
                {"resharded", td.resharded, dc.resharded},
                {"unverified", td.unverified, dc.unverified}};
    for (const auto& r : rows) {
      std::printf("%6d  %-10s %10.1f %10.1f %8.2f %10.2f\n", world, r.op, r.tdist * 1e3,
                  r.dcp * 1e3, r.dcp / r.tdist, total / r.tdist / 1e9);
    }
    std::printf("%6d  %-10s %10lld %10lld %8.4f\n", world, "bytes", (long long)td.bytes,
                (long long)dc.bytes, double(dc.bytes) / double(td.bytes));
    if (world == 1) {
      dcp_save_w1 = dc.save * 1e3;
      dcp_load_w1 = dc.load * 1e3;
    }
  }
  bool python_ok = false;
  const auto [py_save, py_load] = python_dcp(a, &python_ok);
  if (py_save < 0) {
    std::printf("# python: no result (is %s a Python with torch?)\n", a.python.c_str());
  } else {
    std::printf("# python dcp.save %.1f ms, dcp.load %.1f ms (one process)%s\n", py_save, py_load,
                python_ok ? "" : "; PYTHON'S LOAD DID NOT MATCH");
    if (dcp_save_w1 > 0) {
      std::printf("# tdist's DCP at world 1 / Python's: save %.2fx, load %.2fx of Python's time\n",
                  dcp_save_w1 / py_save, dcp_load_w1 / py_load);
    }
  }
  std::printf("#wrong %lld\n", (long long)wrong);
  return wrong == 0 && (py_save < 0 || python_ok) ? 0 : 1;
}

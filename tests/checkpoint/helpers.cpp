#include "checkpoint/helpers.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "support/ranks.h"
#include "tdist/checkpoint/coordinator.h"

namespace tdist::checkpoint::testing {

void expect_reshards_every_world_pair(
    const std::map<std::string, at::Tensor>& full,
    const std::function<SaveOptions(CoordinatorPtr)>& save_options,
    const std::vector<Layout>& load_layouts) {
  const Layout save_layouts[] = {Layout::kEven, Layout::kUneven, Layout::kWhole, Layout::kDim1};
  int case_index = 0;
  for (int n = 1; n <= 4; ++n) {
    for (int m = 1; m <= 4; ++m, ++case_index) {
      const Layout saved_as = save_layouts[case_index % 4];
      const Layout loaded_as = load_layouts[(case_index / 4 + case_index) % load_layouts.size()];
      const std::string what = "save N=" + std::to_string(n) + " " + layout_name(saved_as) +
                               ", load M=" + std::to_string(m) + " " + layout_name(loaded_as);
      SCOPED_TRACE(what);
      const std::string dir = tdist::testing::make_temp_dir("ckpt") + "/ckpt";
      run_with_coordinators(n, [&](int rank, CoordinatorPtr c) {
        ExtraState extra;
        extra.step = 100 + rank;
        save(shard_all(full, rank, n, saved_as, false), extra, dir, save_options(c));
      });
      run_with_coordinators(m, [&](int rank, CoordinatorPtr c) {
        auto target = shard_all(full, rank, m, loaded_as, true);
        const LoadResult r = load(target, dir, LoadOptions().coordinator(c));
        expect_matches_full(target, full, what + " rank " + std::to_string(rank));
        EXPECT_EQ(r.saved_world_size, n);
        EXPECT_EQ(r.extra.step, n == m ? 100 + rank : 100);
      });
    }
  }
}

std::map<std::string, at::Tensor> reference_tensors(int seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  auto randn = [&](at::IntArrayRef shape) { return at::randn(shape, gen); };
  std::map<std::string, at::Tensor> t;
  t["layers.0.weight"] = randn({7, 5});
  t["layers.0.bias"] = randn({7});
  t["layers.1.weight"] = randn({13, 3, 2}).to(at::kDouble);
  t["embed.weight"] = randn({10, 4}).to(at::kBFloat16);
  t["half.weight"] = randn({5, 6}).to(at::kHalf);
  t["counts"] = at::randint(-1000, 1000, {9}, gen).to(at::kLong);
  t["ints"] = at::randint(-1000, 1000, {6, 2}, gen).to(at::kInt);
  t["mask"] = randn({11}).gt(0);
  t["bytes"] = at::randint(0, 255, {3, 3}, gen).to(at::kByte);
  t["scalar.step"] = at::scalar_tensor(seed * 7 + 3, at::kLong);
  t["empty"] = at::empty({0, 3});
  t["one_row"] = randn({1, 8});
  return t;
}

std::string layout_name(Layout layout) {
  switch (layout) {
    case Layout::kEven:
      return "even";
    case Layout::kUneven:
      return "uneven";
    case Layout::kWhole:
      return "whole";
    case Layout::kDim1:
      return "dim1";
  }
  return "?";
}

namespace {

/// [begin, end) of rank's piece of n elements along the split dimension.
std::pair<int64_t, int64_t> split(int64_t n, int rank, int world, Layout layout) {
  if (layout == Layout::kUneven) {
    const int64_t total = int64_t(world) * (world + 1) / 2;
    int64_t before = int64_t(rank) * (rank + 1) / 2;
    int64_t begin = n * before / total;
    int64_t end = n * (before + rank + 1) / total;
    return {begin, end};
  }
  const int64_t chunk = (n + world - 1) / world;
  return {std::min(n, chunk * rank), std::min(n, chunk * (rank + 1))};
}

ShardedTensor shard(const at::Tensor& full, int rank, int world, Layout layout, bool empty) {
  ShardedTensor st;
  st.global_shape = full.sizes().vec();
  st.offsets.assign(full.dim(), 0);
  at::Tensor piece = full;
  if (layout != Layout::kWhole && full.dim() > 0) {
    const int64_t dim = (layout == Layout::kDim1 && full.dim() > 1) ? 1 : 0;
    auto [begin, end] = split(full.size(dim), rank, world, layout);
    piece = full.narrow(dim, begin, end - begin);
    st.offsets[dim] = begin;
  }
  st.local = piece.clone();
  if (empty) {
    if (st.local.scalar_type() == at::kBool) {
      st.local = piece.logical_not();  // differs from the data everywhere
    } else {
      st.local.fill_(-77);
    }
  }
  return st;
}

}  // namespace

ShardedTensor make_shard(const at::Tensor& full, int rank, int world, Layout layout) {
  return shard(full, rank, world, layout, false);
}

ShardedTensor make_empty_shard(const at::Tensor& full, int rank, int world, Layout layout) {
  return shard(full, rank, world, layout, true);
}

ShardedStateDict shard_all(const std::map<std::string, at::Tensor>& full, int rank, int world,
                           Layout layout, bool empty) {
  ShardedStateDict out;
  for (const auto& [name, t] : full) out[name] = shard(t, rank, world, layout, empty);
  return out;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor ca = a.contiguous(), cb = b.contiguous();
  // An empty tensor's data pointer may be null, which memcmp must not get even for 0 bytes.
  return ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

void expect_matches_full(const ShardedStateDict& state,
                         const std::map<std::string, at::Tensor>& full, const std::string& what) {
  for (const auto& [name, st] : state) {
    at::Tensor expected = full.at(name);
    for (int64_t d = 0; d < st.local.dim(); ++d) {
      expected = expected.narrow(d, st.offsets[d], st.local.size(d));
    }
    EXPECT_TRUE(bitwise_equal(st.local, expected)) << what << ": tensor " << name;
  }
}

void run_with_coordinators(int world, const std::function<void(int, CoordinatorPtr)>& fn,
                           std::chrono::milliseconds timeout) {
  tdist::testing::run_ranks_as_threads(world, [&](int rank, int ws, StorePtr store) {
    fn(rank, std::make_shared<StoreCoordinator>(store, rank, ws, "ckpt", timeout));
  });
}

void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(offset);
  f.write(&c, 1);
}

std::string find_file(const std::string& dir, const std::string& prefix) {
  std::string found;
  for (const auto& name : list_dir(dir)) {
    if (name.compare(0, prefix.size(), prefix) == 0) {
      if (!found.empty()) return "";
      found = (std::filesystem::path(dir) / name).string();
    }
  }
  return found;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tdist::checkpoint::testing

// DTensor: torch.chunk's shard arithmetic (pure), distribute_tensor / from_local / to_local /
// full_tensor, redistribute between every pair of placements on 1-D meshes at worlds 1-4 and
// 2-D meshes at worlds 2-4 (uneven shards included), gradients through every move, a
// column- then row-parallel MLP against the single process, and the errors, raised on every
// rank. Expected local tensors come from at::chunk, not from tdist's own arithmetic.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect.h"
#include "support/ranks.h"
#include "support/tensors.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/tensor/dtensor.h"

namespace {

using namespace tdist::testing;
using tdist::mesh::DeviceMesh;
using tdist::mesh::init_device_mesh;
using namespace tdist::tensor;

int world_size() {
  return env_int("WORLD_SIZE", 1);
}

// What `placements` leave this rank of `global`, by at::chunk: the oracle.
at::Tensor expected_local(const at::Tensor& global, const DeviceMesh& mesh,
                          const Placements& placements) {
  at::Tensor t = global;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (is_shard(placements[i])) {
      t = chunk_piece(t, shard_dim(placements[i]), mesh.size(i), mesh.get_local_rank(i));
    }
  }
  return t;
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  tdist::testing::expect_close(a, b, what, 1e-12);
}

// The same global tensor on every rank (one seed), float64 so sums compare exactly enough.
at::Tensor global_tensor(std::vector<int64_t> shape, int seed) {
  torch::manual_seed(seed);
  return torch::randn(shape, torch::kDouble);
}

std::vector<Placement> one_d_sources() {
  return {Shard(0), Shard(1), Replicate(), Partial(), Partial(tdist::ReduceOp::MAX)};
}
std::vector<Placement> one_d_targets() {
  return {Shard(0), Shard(1), Replicate()};
}

TEST(ShardArithmetic, MatchesTorchChunk) {
  for (int64_t n = 0; n <= 12; ++n) {
    for (int64_t k = 1; k <= 5; ++k) {
      const auto chunks = torch::arange(n).chunk(k);
      int64_t offset = 0;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t want = i < static_cast<int64_t>(chunks.size()) ? chunks[i].numel() : 0;
        const auto [length, begin] = local_shard_size_and_offset(n, k, i);
        EXPECT_EQ(length, want) << n << " into " << k << ", chunk " << i;
        if (length > 0) {
          EXPECT_EQ(begin, offset);
        }
        offset += want;
      }
    }
  }
  EXPECT_THROW(local_shard_size_and_offset(4, 2, 2), tdist::InvalidArgument);
}

TEST(PlacementText, AsPyTorchPrintsIt) {
  EXPECT_EQ(to_string(Placements{Shard(1), Replicate(), Partial()}),
            "(Shard(dim=1), Replicate(), Partial(sum))");
  EXPECT_EQ(normalize_placements_for_grad({Partial(tdist::ReduceOp::MAX), Shard(0)}),
            (Placements{Replicate(), Shard(0)}));
}

// distribute_tensor takes src_data_rank's data; local parts are at::chunk's; full_tensor
// gives the tensor back; shape and stride are the global tensor's.
TDIST_SCENARIO(distribute_1d) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  const int rank = tdist::get_rank(), k = world_size();
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{5, 3}, {2, 7}, {8, 4}, {0, 3}}) {
    const at::Tensor global = global_tensor(shape, 1);
    for (const Placement& p : one_d_sources()) {
      const std::string what = to_string(p) + " of " + c10::str(global.sizes());
      // Every rank but the source passes other data: only the source's counts.
      const int src = k - 1;
      const at::Tensor mine = rank == src ? global : global + 100 * (rank + 1);
      const DTensor d = distribute_tensor(mine, mesh, {p}, src);
      EXPECT_EQ(d.shape(), shape) << what;
      EXPECT_EQ(d.stride(), global.strides().vec()) << what;
      EXPECT_EQ(d.placements(), Placements{p}) << what;
      if (is_partial(p) && std::get<Partial>(p).reduce_op == tdist::ReduceOp::SUM) {
        expect_close(d.to_local(), global / k, what);
      } else {
        expect_close(d.to_local(), expected_local(global, mesh, {p}), what);
      }
      expect_close(d.full_tensor(), global, what + ", full_tensor");
      // Without a source, each rank keeps its own data.
      const DTensor own = distribute_tensor(mine, mesh, {p}, std::nullopt);
      if (is_shard(p)) expect_close(own.to_local(), expected_local(mine, mesh, {p}), what);
    }
  }
  tdist::destroy_process_group();
}

void check_pairs(const DeviceMesh& mesh, const std::vector<Placements>& sources,
                 const std::vector<Placements>& targets, const at::Tensor& global) {
  const at::Tensor weight = global_tensor(global.sizes().vec(), 7);
  for (const Placements& from : sources) {
    for (const Placements& to : targets) {
      const std::string what = to_string(from) + " -> " + to_string(to) + " of " +
                               c10::str(global.sizes()) + " on " + mesh.to_string();
      const DTensor source = distribute_tensor(global.clone().requires_grad_(true), mesh, from);
      const DTensor moved = source.redistribute(to);
      ASSERT_EQ(moved.placements(), to) << what;
      expect_close(moved.to_local(), expected_local(global, mesh, to), what);
      expect_close(moved.full_tensor(), global, what + ", full_tensor");
      // d(sum(x * W))/dx = W: each rank's gradient is its part of W in the source's layout,
      // Partial read as Replicate (Note [DTensor autograd]).
      (moved.to_local() * expected_local(weight, mesh, to)).sum().backward();
      const at::Tensor grad = source.to_local().grad();
      ASSERT_TRUE(grad.defined()) << what;
      expect_close(grad, expected_local(weight, mesh, normalize_placements_for_grad(from)),
                   what + ", gradient");
    }
  }
}

TDIST_SCENARIO(redistribute_1d) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  std::vector<Placements> sources, targets;
  for (const Placement& p : one_d_sources()) sources.push_back({p});
  for (const Placement& p : one_d_targets()) targets.push_back({p});
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{8, 12}, {7, 5}, {3, 2}}) {
    check_pairs(mesh, sources, targets, global_tensor(shape, 2));
  }
  tdist::destroy_process_group();
}

TDIST_SCENARIO(redistribute_2d) {
  const int64_t rows = env_int("TDIST_MESH_ROWS", 2);
  DeviceMesh mesh = init_device_mesh("cpu", {rows, world_size() / rows}, {"dp", "tp"});
  const std::vector<Placement> each{Shard(0), Shard(1), Replicate(), Partial()};
  std::vector<Placements> sources, targets;
  for (const Placement& a : each) {
    for (const Placement& b : each) {
      sources.push_back({a, b});
      if (!is_partial(a) && !is_partial(b)) targets.push_back({a, b});
    }
  }
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{8, 12}, {5, 7}}) {
    check_pairs(mesh, sources, targets, global_tensor(shape, 3));
  }
  tdist::destroy_process_group();
}

// Tensor parallelism by hand: a column-parallel then row-parallel MLP on local shards, the
// input's gradient declared Partial (each rank sees only its columns' share), against the
// same MLP in one process.
TDIST_SCENARIO(column_row_mlp) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  const at::Tensor x = global_tensor({4, 6}, 11), w1 = global_tensor({10, 6}, 12),
                   w2 = global_tensor({6, 10}, 13), target = global_tensor({4, 6}, 14);

  at::Tensor rx = x.clone().requires_grad_(true), rw1 = w1.clone().requires_grad_(true),
             rw2 = w2.clone().requires_grad_(true);
  const at::Tensor reference =
      (at::matmul(at::relu(at::matmul(rx, rw1.t())), rw2.t()) * target).sum();
  reference.backward();

  at::Tensor lx = x.clone().requires_grad_(true);
  const DTensor dx = DTensor::from_local(lx, mesh, {Replicate()});
  const DTensor dw1 = distribute_tensor(w1.clone().requires_grad_(true), mesh, {Shard(0)});
  const DTensor dw2 = distribute_tensor(w2.clone().requires_grad_(true), mesh, {Shard(1)});
  const at::Tensor hidden = at::relu(at::matmul(dx.to_local({{Partial()}}), dw1.to_local().t()));
  const at::Tensor partial_out = at::matmul(hidden, dw2.to_local().t());
  const at::Tensor out = DTensor::from_local(partial_out, mesh, {Partial()}).full_tensor();
  const at::Tensor loss = (out * target).sum();
  loss.backward();

  EXPECT_NEAR(loss.item<double>(), reference.item<double>(), 1e-10);
  expect_close(lx.grad(), rx.grad(), "input gradient (all-reduced)");
  expect_close(dw1.to_local().grad(), expected_local(rw1.grad(), mesh, {Shard(0)}), "w1 grad");
  expect_close(dw2.to_local().grad(), expected_local(rw2.grad(), mesh, {Shard(1)}), "w2 grad");
  tdist::destroy_process_group();
}

// run_check measures uneven shards and broadcasts replicas; a local tensor that does not fit
// raises on every rank.
TDIST_SCENARIO(from_local_run_check) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  const int rank = tdist::get_rank();
  const at::Tensor global = global_tensor({7, 3}, 21);
  const at::Tensor part = expected_local(global, mesh, {Shard(0)}).clone();
  const DTensor d = DTensor::from_local(part, mesh, {Shard(0)}, FromLocalOptions().run_check(true));
  EXPECT_EQ(d.shape(), (std::vector<int64_t>{7, 3}));
  expect_close(d.full_tensor(), global, "uneven shards");

  at::Tensor replica = global + rank;
  DTensor::from_local(replica, mesh, {Replicate()}, FromLocalOptions().run_check(true));
  expect_close(replica, global, "replica after run_check's broadcast");

  const at::Tensor wrong = at::zeros({2, rank == world_size() - 1 ? 4 : 3}, at::kDouble);
  if (world_size() > 1) {
    try {
      DTensor::from_local(wrong, mesh, {Shard(0)}, FromLocalOptions().run_check(true));
      ADD_FAILURE() << "rank " << rank << ": a mismatched width passed run_check";
    } catch (const tdist::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("do not form one tensor"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(DTensor::from_local(part, mesh, {Shard(0)},
                                   FromLocalOptions().shape(std::vector<int64_t>{7, 4})),
               tdist::InvalidArgument);
  tdist::destroy_process_group();
}

TDIST_SCENARIO(errors) {
  DeviceMesh mesh = init_device_mesh("cpu", {world_size()});
  const at::Tensor t = torch::ones({4, 2});
  expect_invalid_argument(
      [&] {
        distribute_tensor(t, mesh, {Shard(0), Shard(1)});
      },
      "give one placement per mesh dimension");
  expect_invalid_argument([&] { distribute_tensor(t, mesh, {Shard(2)}); },
                          "the dim must be in [-2, 2)");
  expect_invalid_argument([&] { distribute_tensor(t, mesh, {Shard(0)}, world_size()); },
                          "src_data_rank " + std::to_string(world_size()));
  expect_invalid_argument([&] { distribute_tensor(t, mesh, {Partial(tdist::ReduceOp::PRODUCT)}); },
                          "is not supported");
  const DTensor d = distribute_tensor(t, mesh, {Shard(0)});
  expect_invalid_argument([&] { d.redistribute({Partial()}); },
                          "moving to Partial is for internal use");
  // Negative shard dims count from the end.
  EXPECT_EQ(d.redistribute({Shard(-1)}).placements(), (Placements{Shard(1)}));
  tdist::destroy_process_group();
}

ProcessOptions with_mesh_rows(const std::string& rows) {
  ProcessOptions options;
  options.env = {{"TDIST_MESH_ROWS", rows}};
  return options;
}

TEST(DTensor, DistributeAndFullTensor) {
  expect_all_ok_at_worlds("distribute_1d", {1, 2, 3, 4});
}
TEST(DTensor, RedistributeEveryPairOneDimensional) {
  expect_all_ok_at_worlds("redistribute_1d", {1, 2, 3, 4});
}
TEST(DTensor, RedistributeEveryPairTwoDimensional) {
  expect_all_ok_at_worlds("redistribute_2d", {4, 2}, with_mesh_rows("2"));
  expect_all_ok_at_worlds("redistribute_2d", {3}, with_mesh_rows("1"));
  expect_all_ok_at_worlds("redistribute_2d", {3}, with_mesh_rows("3"));
}
TEST(DTensor, ColumnThenRowParallelMatchesOneProcess) {
  expect_all_ok_at_worlds("column_row_mlp", {1, 2, 3});
}
TEST(DTensor, FromLocalRunCheck) {
  expect_all_ok_at_worlds("from_local_run_check", {1, 3, 4});
}
TEST(DTensor, Errors) {
  expect_all_ok_at_worlds("errors", {1, 2});
}

}  // namespace

// DeviceMesh: group layout (pure), 1-D/2-D meshes with real groups, slicing, and the
// errors of SPEC §2 (each raised on every rank, never a hang).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/ranks.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/mesh/device_mesh.h"

namespace {

using namespace tdist::testing;
using tdist::mesh::DeviceMesh;
using tdist::mesh::init_device_mesh;
using Groups = std::vector<std::vector<int>>;

TEST(MeshLayout, GroupsAlongEachDimension) {
  std::vector<int> layout{0, 1, 2, 3, 4, 5};
  // shape (2, 3): rows {0,1,2},{3,4,5}; columns {0,3},{1,4},{2,5}.
  EXPECT_EQ(tdist::mesh::detail::groups_along_dim({2, 3}, layout, 1),
            (Groups{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(tdist::mesh::detail::groups_along_dim({2, 3}, layout, 0),
            (Groups{{0, 3}, {1, 4}, {2, 5}}));
}

TEST(MeshLayout, ThreeDimensions) {
  std::vector<int> layout(8);
  for (int i = 0; i < 8; ++i) layout[i] = i;
  EXPECT_EQ(tdist::mesh::detail::groups_along_dim({2, 2, 2}, layout, 1),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(tdist::mesh::detail::groups_along_dim({2, 2, 2}, layout, 0),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

/// Sum of global ranks over `group`, by a real all-reduce.
int rank_sum(const tdist::ProcessGroupPtr& group) {
  at::Tensor t = torch::full({1}, tdist::get_rank(), torch::kInt);
  tdist::all_reduce(t, tdist::ReduceOp::SUM, group);
  return t.item<int>();
}

TDIST_SCENARIO(mesh_1d) {
  // init_device_mesh initialises the default group itself (env://).
  DeviceMesh mesh = init_device_mesh("cpu", {std::stoll(std::getenv("WORLD_SIZE"))});
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  EXPECT_EQ(mesh.ndim(), 1);
  EXPECT_EQ(mesh.size(), world);
  EXPECT_EQ(mesh.get_local_rank(), rank);
  EXPECT_EQ(mesh.get_rank(), rank);
  EXPECT_EQ(rank_sum(mesh.get_group()), world * (world - 1) / 2);
  tdist::destroy_process_group();
}

TDIST_SCENARIO(mesh_2d) {
  tdist::init_process_group();
  const int rank = tdist::get_rank();  // world 4 as (dp=2, tp=2): tp groups {0,1},{2,3}
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  EXPECT_EQ(mesh.shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(mesh.layout(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(mesh.to_string(), "DeviceMesh(cpu, shape=(2, 2), dims=(dp, tp), layout=[0, 1, 2, 3])");
  EXPECT_EQ(mesh.get_local_rank("dp"), rank / 2);
  EXPECT_EQ(mesh.get_local_rank("tp"), rank % 2);
  EXPECT_EQ(mesh.size("tp"), 2);
  EXPECT_EQ(mesh.get_group("tp")->global_ranks(),
            (std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1}));
  EXPECT_EQ(rank_sum(mesh.get_group("tp")), (rank / 2) * 4 + 1);  // {0,1}->1, {2,3}->5
  EXPECT_EQ(rank_sum(mesh.get_group("dp")), 2 + 2 * (rank % 2));  // {0,2}->2, {1,3}->4
  EXPECT_EQ(rank_sum(mesh.get_group(1)), rank_sum(mesh.get_group("tp")));

  DeviceMesh dp = mesh["dp"];
  EXPECT_EQ(dp.ndim(), 1);
  EXPECT_EQ(dp.layout(), (std::vector<int>{rank % 2, rank % 2 + 2}));
  EXPECT_EQ(dp.get_local_rank(), rank / 2);
  EXPECT_EQ(dp.get_group(), mesh.get_group("dp"));
  EXPECT_EQ(dp.get_rank(), rank);
  DeviceMesh swapped = mesh[std::vector<std::string>{"tp", "dp"}];
  EXPECT_EQ(swapped.layout(), (std::vector<int>{0, 2, 1, 3}));

  EXPECT_THROW(mesh.get_group(), tdist::InvalidArgument);  // 2-D: name the dimension
  EXPECT_THROW(mesh.get_group("pp"), tdist::InvalidArgument);
  EXPECT_THROW(mesh["pp"], tdist::InvalidArgument);

  // backend_override by name and by index.
  DeviceMesh overridden =
      init_device_mesh("cpu", {2, 2}, {"dp", "tp"}, {{"tp", "gloo"}, {0, "gloo"}});
  EXPECT_EQ(rank_sum(overridden.get_group("tp")), (rank / 2) * 4 + 1);
  tdist::destroy_process_group();
}

/// TDIST_MESH_CASE picks the bad call; every rank must raise InvalidArgument whose message
/// contains TDIST_MESH_EXPECT.
TDIST_SCENARIO(mesh_error) {
  tdist::init_process_group();
  const int rank = tdist::get_rank();
  const std::string which = std::getenv("TDIST_MESH_CASE");
  const std::string expect = std::getenv("TDIST_MESH_EXPECT");
  try {
    if (which == "product") init_device_mesh("cpu", {3, 3});
    if (which == "duplicate") init_device_mesh("cpu", {1, 2}, {"dp", "dp"});
    if (which == "indexed") init_device_mesh("cuda:0", {2});
    if (which == "names") init_device_mesh("cpu", {2}, {"dp", "tp"});
    // Different shapes on different ranks (same product): must raise, not hang.
    if (which == "mismatch")
      init_device_mesh("cpu", rank == 1 ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{1, 2});
    // Different world-size products: rank 1 alone has a wrong product.
    if (which == "mismatch_product") {
      init_device_mesh("cpu", rank == 1 ? std::vector<int64_t>{4} : std::vector<int64_t>{2});
    }
    ADD_FAILURE() << "rank " << rank << ": no error for case " << which;
  } catch (const tdist::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
  }
  tdist::destroy_process_group();
}

void run(const std::string& scenario, int world, std::map<std::string, std::string> env = {}) {
  ProcessOptions options;
  options.env = std::move(env);
  options.timeout = std::chrono::seconds(60);
  expect_all_ok(run_ranks_as_processes(scenario, world, options));
}

TEST(Mesh, OneDimensional) {
  for (int world : {1, 2, 3}) run("mesh_1d", world);
}
TEST(Mesh, TwoDimensionalGroupsAndSlicing) {
  run("mesh_2d", 4);
}

TEST(Mesh, Errors) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"product", "product is the world size"},
      {"duplicate", "repeats 'dp'"},
      {"indexed", "device index"},
      {"names", "one name per dimension"},
      {"mismatch", "different arguments across ranks"},
      {"mismatch_product", "different arguments across ranks"},
  };
  for (const auto& [which, expect] : cases) {
    SCOPED_TRACE(which);
    run("mesh_error", 2, {{"TDIST_MESH_CASE", which}, {"TDIST_MESH_EXPECT", expect}});
  }
}

}  // namespace

// Complex tensors through every collective (Note [Complex tensors] in src/comm/collectives.cpp)
// at world sizes 1-4, on the world and on a subgroup, in complex64 and complex128, against
// results computed locally from every rank's known input; reductions that complex numbers do
// not define are refused on every rank.
#include <torch/torch.h>

#include <numeric>

#include "comm/comm_test_util.h"

namespace tdist {
namespace {

using namespace tdist::testing;

/// Group rank `rank`'s input: distinct real and imaginary parts, exact in complex64 sums.
at::Tensor complex_input(int rank, int64_t numel, at::ScalarType dtype) {
  at::Tensor re = torch::arange(numel, torch::kFloat64) + 100 * rank;
  at::Tensor im = -torch::arange(numel, torch::kFloat64) * (rank + 2);
  return torch::complex(re, im).to(dtype);
}

at::Tensor complex_sum(int n, int64_t numel, at::ScalarType dtype) {
  at::Tensor sum = torch::zeros({numel}, torch::TensorOptions().dtype(dtype));
  for (int r = 0; r < n; ++r) sum += complex_input(r, numel, dtype);
  return sum;
}

void expect_same(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << what;
  EXPECT_TRUE(torch::equal(got, want)) << what << ":\n" << got << "\nwant\n" << want;
}

void check_complex_reductions(const ProcessGroupPtr& group, at::ScalarType dtype) {
  const int rank = get_rank(group), n = get_world_size(group);
  auto global = [&](int r) { return get_global_rank(group ? group : group_world(), r); };

  at::Tensor t = complex_input(rank, 5, dtype);
  all_reduce(t, ReduceOp::SUM, group);
  expect_same(t, complex_sum(n, 5, dtype), "all_reduce SUM");

  t = complex_input(rank, 5, dtype);
  all_reduce(t, ReduceOp::AVG, group);
  EXPECT_TRUE(torch::allclose(t, complex_sum(n, 5, dtype) / n)) << "all_reduce AVG " << t;

  std::vector<at::Tensor> list{complex_input(rank, 5, dtype), complex_input(rank, 3, dtype)};
  all_reduce_coalesced(list, ReduceOp::SUM, group);
  expect_same(list[0], complex_sum(n, 5, dtype), "all_reduce_coalesced [0]");
  expect_same(list[1], complex_sum(n, 3, dtype), "all_reduce_coalesced [1]");

  t = complex_input(rank, 4, dtype);
  reduce(t, global(n - 1), ReduceOp::SUM, group);
  if (rank == n - 1) expect_same(t, complex_sum(n, 4, dtype), "reduce");

  at::Tensor out = torch::zeros({2}, torch::TensorOptions().dtype(dtype));
  reduce_scatter_tensor(out, complex_input(rank, 2 * n, dtype), ReduceOp::SUM, group);
  expect_same(out, complex_sum(n, 2 * n, dtype).narrow(0, 2 * rank, 2), "reduce_scatter_tensor");

  std::vector<at::Tensor> pieces = complex_input(rank, 2 * n, dtype).split(2);
  out.zero_();
  reduce_scatter(out, pieces, ReduceOp::SUM, group);
  expect_same(out, complex_sum(n, 2 * n, dtype).narrow(0, 2 * rank, 2), "reduce_scatter");

  for (ReduceOp op : {ReduceOp::MAX, ReduceOp::MIN, ReduceOp::PRODUCT, ReduceOp::BOR}) {
    at::Tensor before = complex_input(rank, 3, dtype);
    at::Tensor x = before.clone();
    try {
      all_reduce(x, op, group);
      ADD_FAILURE() << to_string(op) << " on a complex tensor was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("not defined on complex numbers"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(reduce(x, global(0), op, group), InvalidArgument) << to_string(op);
    expect_same(x, before, "a refused reduction leaves the tensor as it was");
  }
}

void check_complex_data_movement(const ProcessGroupPtr& group, at::ScalarType dtype) {
  const int rank = get_rank(group), n = get_world_size(group);
  auto global = [&](int r) { return get_global_rank(group ? group : group_world(), r); };
  auto zeros = [&](int64_t numel) {
    return torch::zeros({numel}, torch::TensorOptions().dtype(dtype));
  };

  at::Tensor t = complex_input(rank, 4, dtype);
  broadcast(t, global(n - 1), group);
  expect_same(t, complex_input(n - 1, 4, dtype), "broadcast");

  std::vector<at::Tensor> gathered;
  for (int r = 0; r < n; ++r) gathered.push_back(zeros(4));
  all_gather(gathered, complex_input(rank, 4, dtype), group);
  for (int r = 0; r < n; ++r) expect_same(gathered[r], complex_input(r, 4, dtype), "all_gather");

  at::Tensor flat = zeros(4 * n);
  all_gather_into_tensor(flat, complex_input(rank, 4, dtype), group);
  for (int r = 0; r < n; ++r) {
    expect_same(flat.narrow(0, 4 * r, 4), complex_input(r, 4, dtype), "all_gather_into_tensor");
  }

  std::vector<at::Tensor> at_root;
  if (rank == 0) {
    for (int r = 0; r < n; ++r) at_root.push_back(zeros(3));
  }
  gather(complex_input(rank, 3, dtype), at_root, global(0), group);
  for (int r = 0; r < static_cast<int>(at_root.size()); ++r) {
    expect_same(at_root[r], complex_input(r, 3, dtype), "gather");
  }

  std::vector<at::Tensor> to_scatter;
  if (rank == n - 1) {
    for (int r = 0; r < n; ++r) to_scatter.push_back(complex_input(r, 3, dtype));
  }
  at::Tensor mine = zeros(3);
  scatter(mine, to_scatter, global(n - 1), group);
  expect_same(mine, complex_input(rank, 3, dtype), "scatter");

  // Rank r sends r + d + 1 elements to rank d: uneven splits of the complex dimension 0.
  std::vector<int64_t> in_splits, out_splits;
  for (int d = 0; d < n; ++d) in_splits.push_back(rank + d + 1);
  for (int s = 0; s < n; ++s) out_splits.push_back(s + rank + 1);
  auto sent_by = [&](int s) {
    int64_t numel = 0;
    for (int d = 0; d < n; ++d) numel += s + d + 1;
    return complex_input(s, numel, dtype);
  };
  at::Tensor received = zeros(std::accumulate(out_splits.begin(), out_splits.end(), int64_t(0)));
  all_to_all_single(received, sent_by(rank), out_splits, in_splits, group);
  int64_t offset = 0;
  for (int s = 0; s < n; ++s) {
    int64_t from = 0;
    for (int d = 0; d < rank; ++d) from += s + d + 1;
    expect_same(received.narrow(0, offset, out_splits[s]),
                sent_by(s).narrow(0, from, out_splits[s]),
                "all_to_all_single from " + std::to_string(s));
    offset += out_splits[s];
  }

  std::vector<at::Tensor> outs, ins = complex_input(rank, 2 * n, dtype).split(2);
  for (int r = 0; r < n; ++r) outs.push_back(zeros(2));
  all_to_all(outs, ins, group);
  for (int s = 0; s < n; ++s) {
    expect_same(outs[s], complex_input(s, 2 * n, dtype).narrow(0, 2 * rank, 2), "all_to_all");
  }

  if (n > 1) {
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    at::Tensor from_left = zeros(3);
    auto works =
        batch_isend_irecv({P2POp(isend, complex_input(rank, 3, dtype), global(right), group),
                           P2POp(irecv, from_left, global(left), group)});
    for (auto& w : works) w->wait();
    expect_same(from_left, complex_input(left, 3, dtype), "batch_isend_irecv");
    if (rank == 0) send(complex_input(0, 3, dtype).conj(), global(1), group);
    if (rank == 1) {
      at::Tensor got = zeros(3);
      recv(got, global(0), group);
      expect_same(got, complex_input(0, 3, dtype).conj().resolve_conj(), "send of a conj view");
    }
  }
}

TDIST_SCENARIO(comm_complex_tensors) {
  init_process_group(test_init_options());
  for (auto dtype : {at::kComplexFloat, at::kComplexDouble}) {
    SCOPED_TRACE(c10::toString(dtype));
    check_on_world_and_a_subgroup([&](const ProcessGroupPtr& g) {
      check_complex_reductions(g, dtype);
      check_complex_data_movement(g, dtype);
    });
  }
  // A lazily conjugated output would be written through a copy the caller never sees.
  at::Tensor lazy = complex_input(get_rank(), 3, at::kComplexFloat).conj();
  EXPECT_THROW(all_reduce(lazy), InvalidArgument);
  destroy_process_group();
}

TEST(ComplexTensors, EveryCollectiveAtWorldSizes1To4) {
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("world size " + std::to_string(n));
    expect_all_ok(run_ranks_as_processes("comm_complex_tensors", n, short_run()));
  }
}

}  // namespace
}  // namespace tdist

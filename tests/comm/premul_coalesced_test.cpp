// ReduceOp PREMUL_SUM (torch.distributed._make_nccl_premul_sum) on the backends that apply it
// by scaling first, all_gather_coalesced and get_backend_config, at world sizes 1-4:
// results against sums and concatenations computed here, every reducing collective PREMUL_SUM
// reaches, and every bad input refused before anything is sent.
#include <torch/torch.h>

#include "comm/comm_test_util.h"
#include "support/expect.h"
#include "tdist/comm/backend.h"

namespace tdist::premul_coalesced_test {
namespace {

using namespace tdist::testing;

/// Group rank r's input: small integers (exact in bfloat16), complex as (x, -x).
at::Tensor input_of(int r, at::ScalarType dtype, int64_t numel = 6) {
  at::Tensor x = torch::arange(numel, torch::kDouble) + r + 1;
  if (c10::isComplexType(dtype)) return torch::complex(x, -x).to(dtype);
  return x.to(dtype);
}

/// sum_r factor * x_r, in float64 (complex128).
at::Tensor premul_sum_of(int size, at::ScalarType dtype, double factor, int64_t numel = 6) {
  at::Tensor acc = torch::zeros_like(
      input_of(0, dtype, numel)
          .to(c10::isComplexType(dtype) ? torch::kComplexDouble : torch::kDouble));
  for (int r = 0; r < size; ++r) acc += factor * input_of(r, acc.scalar_type(), numel);
  return acc;
}

void expect_equal_to(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_TRUE(torch::equal(got, want.to(got.scalar_type())))
      << what << ": " << got << " vs " << want;
}

void check_premul_sum(const ProcessGroupPtr& g) {
  const int size = get_world_size(g), me = get_rank(g);
  const std::vector<std::pair<std::string, ReduceOp>> ops{
      {"scalar 0.5", make_nccl_premul_sum(0.5)},
      {"float64 tensor 0.5", make_nccl_premul_sum(torch::full({1}, 0.5, torch::kDouble))},
      {"0-dim float32 tensor 0.5", make_nccl_premul_sum(torch::scalar_tensor(0.5))}};
  for (const auto& [name, op] : ops) {
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kComplexFloat}) {
      SCOPED_TRACE(name + ", " + std::string(c10::toString(dtype)));
      const at::Tensor want = premul_sum_of(size, dtype, 0.5);
      at::Tensor t = input_of(me, dtype);
      all_reduce(t, op, g);
      expect_equal_to(t, want, "all_reduce");
      t = input_of(me, dtype);
      all_reduce(t, op, g, /*async_op=*/true)->wait();
      expect_equal_to(t, want, "all_reduce (async)");

      std::vector<at::Tensor> pair{input_of(me, dtype), input_of(me, dtype, 3)};
      all_reduce_coalesced(pair, op, g);
      expect_equal_to(pair[0], want, "all_reduce_coalesced[0]");
      expect_equal_to(pair[1], premul_sum_of(size, dtype, 0.5, 3), "all_reduce_coalesced[1]");

      for (int root = 0; root < size; ++root) {
        t = input_of(me, dtype);
        reduce(t, std::nullopt, op, g, false, root);
        // The root gets the reduction; the others keep their input, as NCCL leaves it.
        expect_equal_to(t, me == root ? want : input_of(me, dtype), "reduce");
      }

      const int64_t chunk = 2;
      at::Tensor in = input_of(me, dtype, chunk * size), out = torch::zeros({chunk}, in.options());
      const at::Tensor before = in.clone();
      reduce_scatter_tensor(out, in, op, g);
      expect_equal_to(out,
                      premul_sum_of(size, dtype, 0.5, chunk * size).narrow(0, chunk * me, chunk),
                      "reduce_scatter_tensor");
      expect_equal_to(in, before, "reduce_scatter_tensor's input");
      out.zero_();
      reduce_scatter(out, in.chunk(size), op, g);
      expect_equal_to(out,
                      premul_sum_of(size, dtype, 0.5, chunk * size).narrow(0, chunk * me, chunk),
                      "reduce_scatter");
    }
  }
  at::Tensor ints = torch::ones({2}, torch::kLong);
  expect_invalid_argument([&] { all_reduce(ints, make_nccl_premul_sum(2.0), g); },
                          "PREMUL_SUM is defined for float16, bfloat16, float32 and float64 "
                          "tensors");
  at::Tensor t = torch::ones({2});
  expect_invalid_argument([&] { all_reduce(t, ReduceOp::PREMUL_SUM, g); },
                          "PREMUL_SUM needs its factor; pass make_nccl_premul_sum(factor)");
  at::Tensor one = torch::ones({1}), per_rank = torch::ones({size});
  expect_invalid_argument([&] { reduce_scatter_tensor(one, per_rank, ReduceOp::PREMUL_SUM, g); },
                          "PREMUL_SUM needs its factor");
  EXPECT_TRUE(t.equal(torch::ones({2}))) << "a refused call changed its tensor";
}

void check_all_gather_coalesced(const ProcessGroupPtr& g) {
  const int size = get_world_size(g), me = get_rank(g);
  for (auto dtype : {torch::kFloat, torch::kLong, torch::kComplexDouble}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto inputs_of = [&](int r) {
      return std::vector<at::Tensor>{input_of(r, dtype, 4).view({2, 2}), input_of(r, dtype, 1),
                                     input_of(r, dtype, 3) * 100, input_of(r, dtype, 0)};
    };
    for (bool async_op : {false, true}) {
      std::vector<std::vector<at::Tensor>> outputs(size);
      for (auto& list : outputs) {
        for (const auto& t : inputs_of(0)) list.push_back(torch::full_like(t, -1));
      }
      WorkPtr work = all_gather_coalesced(outputs, inputs_of(me), g, async_op);
      work->wait();
      EXPECT_TRUE(work->is_success());
      for (int r = 0; r < size; ++r) {
        const auto want = inputs_of(r);
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_TRUE(torch::equal(outputs[r][i], want[i]))
              << "rank " << r << " input " << i << ": " << outputs[r][i];
        }
      }
    }
  }
  std::vector<at::Tensor> in{torch::ones({4}), torch::ones({2})};
  auto outputs_like = [&](int lists, std::vector<at::Tensor> shapes) {
    std::vector<std::vector<at::Tensor>> out(lists);
    for (auto& list : out) {
      for (const auto& t : shapes) list.push_back(torch::empty_like(t));
    }
    return out;
  };
  auto wrong_count = outputs_like(size + 1, in);
  expect_invalid_argument([&] { all_gather_coalesced(wrong_count, in, g); },
                          "output_tensor_lists has " + std::to_string(size + 1) +
                              " tensors but the group has " + std::to_string(size) + " ranks");
  auto short_list = outputs_like(size, {in[0]});
  expect_invalid_argument([&] { all_gather_coalesced(short_list, in, g); },
                          "output_tensor_lists[0] has 1 tensors but input_tensor_list has 2");
  auto wrong_size = outputs_like(size, {in[0], torch::ones({3})});
  expect_invalid_argument([&] { all_gather_coalesced(wrong_size, in, g); },
                          "output_tensor_lists[0][1] has 3 elements but the input has 2");
  auto mixed = outputs_like(size, in);
  std::vector<at::Tensor> mixed_in{torch::ones({4}), torch::ones({2}, torch::kDouble)};
  expect_invalid_argument([&] { all_gather_coalesced(mixed, mixed_in, g); },
                          "input_tensor_list[1] has dtype Double but the input has Float");
  std::vector<std::vector<at::Tensor>> none(size);
  expect_invalid_argument([&] { all_gather_coalesced(none, {}, g); }, "input_tensor_list is empty");
}

std::string config_of(const std::string& backend) {
  std::string out;
  const auto capability = Backend::backend_capability();
  for (const auto& device : capability.at(backend)) {
    out += (out.empty() ? "" : ",") + device + ":" + backend;
  }
  return out;
}

TDIST_SCENARIO(comm_premul_coalesced_config) {
  init_process_group(test_init_options());
  check_on_world_and_a_subgroup(check_premul_sum);
  check_on_world_and_a_subgroup(check_all_gather_coalesced);

  EXPECT_EQ(get_backend_config(), config_of(test_backend()));
  auto cpu_only = new_group({0}, NewGroupOptions().backend("cpu:" + test_backend()));
  if (get_rank() == 0) {
    EXPECT_EQ(get_backend_config(cpu_only), "cpu:" + test_backend());
  } else {
    expect_invalid_argument([&] { get_backend_config(cpu_only); },
                            "get_backend_config: this process is not a member of group");
  }
  barrier();
  destroy_process_group();
}

TEST(PremulSumCoalescedConfig, AtWorlds1To4) {
  expect_all_ok_at_worlds("comm_premul_coalesced_config", {1, 2, 3, 4},
                          short_run(std::chrono::seconds(120)));
}

TEST(ReduceOpValue, KindsFactorsAndCodes) {
  const ReduceOp sum = ReduceOp::SUM;
  EXPECT_EQ(sum, ReduceOp::SUM);
  EXPECT_FALSE(sum.has_factor());
  EXPECT_EQ(to_string(ReduceOp::PREMUL_SUM), "PREMUL_SUM");
  EXPECT_EQ(ReduceOp::from_code(ReduceOp(ReduceOp::BXOR).code()), ReduceOp::BXOR);
  expect_invalid_argument([] { ReduceOp::from_code(9); }, "ReduceOp code 9 names no");
  const ReduceOp scalar = make_nccl_premul_sum(0.25);
  EXPECT_EQ(scalar, ReduceOp::PREMUL_SUM);
  EXPECT_TRUE(scalar.has_factor());
  EXPECT_EQ(scalar.scalar_factor(), 0.25);
  EXPECT_FALSE(scalar.tensor_factor().defined());
  const ReduceOp tensor = make_nccl_premul_sum(torch::full({1}, 3.0, torch::kBFloat16));
  EXPECT_EQ(tensor.scalar_factor(), 1.0);
  EXPECT_TRUE(tensor.factor_like(torch::zeros({2}, torch::kDouble))
                  .equal(torch::scalar_tensor(3.0, torch::kDouble)));
  expect_invalid_argument([] { make_nccl_premul_sum(torch::ones({2})); },
                          "the factor tensor has 2 elements");
  expect_invalid_argument([] { make_nccl_premul_sum(torch::ones({1}, torch::kLong)); },
                          "takes a real floating factor");
  expect_invalid_argument([] { make_nccl_premul_sum(at::Tensor()); },
                          "the factor tensor is undefined");
}

}  // namespace
}  // namespace tdist::premul_coalesced_test

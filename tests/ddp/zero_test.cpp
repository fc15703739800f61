// ZeroRedundancyOptimizer's state dicts, param groups and bucket views: ranks as processes,
// checked every step against one process running the same optimizer over every parameter.
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/training_helpers.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "support/tensors.h"
#include "tdist/checkpoint/optimizer_param_groups.h"
#include "tdist/comm/distributed.h"
#include "tdist/comm/object.h"
#include "tdist/ddp/zero_redundancy_optimizer.h"
#include "tdist/detail/util/optimizer_state.h"
#include "tdist/error.h"
#include "tdist/optim/adam.h"

namespace {

using namespace tdist::testing;
namespace ddp = tdist::ddp;
using nlohmann::json;
using torch::optim::OptimizerParamGroup;

constexpr double kTol = 1e-6;
constexpr int kSaveAfter = 6;    // steps before the state dict is saved
constexpr int kResumeSteps = 5;  // steps after it is loaded
constexpr double kLr = 0.01;

/// Seven parameters of uneven sizes, the last one double (its own bucket and broadcast).
std::vector<at::Tensor> make_params() {
  torch::manual_seed(7);
  const std::vector<std::vector<int64_t>> shapes{{5, 3}, {7}, {2, 2}, {11}, {3, 4}, {1}, {6}};
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto dtype = i + 1 == shapes.size() ? torch::kDouble : torch::kFloat;
    out.push_back(torch::randn(shapes[i], dtype).requires_grad_(true));
  }
  return out;
}

/// The same gradients on every rank (and in the reference) at step `s`.
void set_grads(const std::vector<at::Tensor>& params, int s) {
  torch::manual_seed(1000 + s);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto target = torch::randn(params[i].sizes(), params[i].options().requires_grad(false));
    params[i].mutable_grad() = 2.0 * (static_cast<double>(i) + 1) * (params[i].detach() - target);
  }
}

/// TDIST_ZERO_OPT: adam (amsgrad, weight decay) | sgd (nesterov momentum) | tdist_adam.
std::string opt_kind() {
  return env_or("TDIST_ZERO_OPT", "adam");
}

ddp::OptimizerFactory make_factory(const std::string& kind) {
  if (kind == "sgd") {
    return ddp::optimizer_factory<torch::optim::SGD>(
        torch::optim::SGDOptions(kLr * 10).momentum(0.9).nesterov(true));
  }
  if (kind == "tdist_adam") {
    return ddp::optimizer_factory<tdist::optim::Adam>(tdist::optim::AdamOptions(kLr));
  }
  return ddp::optimizer_factory<torch::optim::Adam>(
      torch::optim::AdamOptions(kLr).weight_decay(0.01).amsgrad(true));
}

std::set<std::string> required_options(const std::string& kind) {
  if (kind == "sgd") return {"lr", "momentum", "dampening", "weight_decay", "nesterov"};
  return {"lr", "betas", "eps", "weight_decay", "amsgrad"};
}

std::vector<at::Tensor> clone_params(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

/// The single-process reference: the factory's optimizer over every parameter.
struct Reference {
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> opt;
  Reference(const std::vector<at::Tensor>& initial, const std::string& kind, size_t count)
      : params(clone_params(initial)) {
    std::vector<at::Tensor> held(params.begin(), params.begin() + count);
    opt = make_factory(kind)({OptimizerParamGroup(held)});
  }
  void step(int s) {
    set_grads(params, s);
    opt->step();
    opt->zero_grad();
  }
};

/// Names the reference's parameters p0, p1, ... for tdist::checkpoint's param groups.
struct ParamHolder : torch::nn::Module {
  explicit ParamHolder(const std::vector<at::Tensor>& params) {
    for (size_t i = 0; i < params.size(); ++i)
      register_parameter("p" + std::to_string(i), params[i]);
  }
};

void halve_lr(torch::optim::Optimizer& opt) {
  for (auto& g : opt.param_groups()) g.options().set_lr(g.options().get_lr() / 2);
}

/// The schedule both runs follow: the lr halves before step 3.
void zero_step(ddp::ZeroRedundancyOptimizer& zero, Reference& ref, int s) {
  if (s == 3) {
    halve_lr(*zero.local_optimizer());
    halve_lr(*ref.opt);
  }
  set_grads(zero.parameters(), s);
  zero.step();
  zero.zero_grad();
  ref.step(s);
  EXPECT_LE(max_abs_diff(zero.parameters(), ref.params), kTol)
      << "rank " << tdist::get_rank() << " step " << s;
}

/// The consolidated state equals the reference optimizer's, field by field.
void expect_state_of_reference(const ddp::ZeroStateDict& sd, Reference& ref) {
  size_t fields = 0;
  for (size_t i = 0; i < ref.params.size(); ++i) {
    for (const auto& f :
         tdist::util::optimizer_state_fields(*ref.opt, ref.params[i], ref.params[i])) {
      const std::string key = std::to_string(i) + "." + f.name;
      auto it = sd.state.find(key);
      ASSERT_NE(it, sd.state.end()) << "missing " << key;
      if (f.is_step) {
        EXPECT_EQ(it->second.local.item<int64_t>(), f.tensor.item<int64_t>()) << key;
      } else {
        expect_close(it->second.local, f.tensor, key, kTol);
      }
      ++fields;
    }
  }
  EXPECT_GT(fields, 0u);
  EXPECT_EQ(sd.state.size(), fields);
}

/// The param groups hold every option tdist::checkpoint writes for the reference, equal.
void expect_groups_of_reference(const ddp::ZeroStateDict& sd, Reference& ref,
                                const std::vector<std::vector<size_t>>& indices) {
  ParamHolder holder(ref.params);
  const json expected = tdist::checkpoint::optimizer_param_groups(holder, *ref.opt);
  ASSERT_EQ(sd.param_groups.size(), expected.size()) << sd.param_groups.dump();
  for (size_t g = 0; g < expected.size(); ++g) {
    const json& mine = sd.param_groups[g];
    EXPECT_EQ(mine.at("params"), json(indices[g])) << mine.dump();
    for (const auto& key : required_options(opt_kind())) {
      EXPECT_TRUE(mine.contains(key)) << "group " << g << " lacks " << key << ": " << mine.dump();
    }
    for (const auto& [key, value] : mine.items()) {
      if (key == "params") continue;
      ASSERT_TRUE(expected[g].contains(key)) << key;
      EXPECT_EQ(value, expected[g][key]) << "group " << g << " option " << key;
    }
  }
}

/// parameters_as_bucket_view: every parameter is a view into its owner's bucket, in order.
void expect_bucket_views(const ddp::ZeroRedundancyOptimizer& zero) {
  const auto& params = zero.parameters();
  std::vector<int> covered(params.size(), 0);
  ASSERT_FALSE(zero.buckets().empty());
  for (const auto& b : zero.buckets()) {
    int64_t offset = 0;
    for (auto i : b.indices) {
      EXPECT_EQ(zero.owner(i), b.rank);
      EXPECT_EQ(params[i].scalar_type(), b.buffer.scalar_type());
      EXPECT_EQ(params[i].data_ptr(),
                static_cast<char*>(b.buffer.data_ptr()) + offset * b.buffer.element_size())
          << "parameter " << i << " is not a view into its bucket";
      offset += params[i].numel();
      ++covered[i];
    }
    EXPECT_EQ(offset, b.buffer.numel());
  }
  for (size_t i = 0; i < covered.size(); ++i) EXPECT_EQ(covered[i], 1) << "parameter " << i;
}

ddp::ZeroRedundancyOptimizerOptions zero_options() {
  return ddp::ZeroRedundancyOptimizerOptions().parameters_as_bucket_view(
      env_or("TDIST_ZERO_BUCKETS", "0") == "1");
}

std::string state_file() {
  return env_or("TDIST_ZERO_DIR", "/tmp") + "/zero_state.bin";
}

/// Trains kSaveAfter steps against the reference, checks the consolidated state dict on the
/// last rank, and saves it there with the parameters.
TDIST_SCENARIO(zero_train_and_save) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  const int to = world - 1;
  const auto initial = make_params();
  Reference ref(initial, opt_kind(), initial.size());
  ddp::ZeroRedundancyOptimizer zero(clone_params(initial), make_factory(opt_kind()),
                                    zero_options());
  if (zero_options().parameters_as_bucket_view()) {
    expect_bucket_views(zero);
  } else {
    EXPECT_TRUE(zero.buckets().empty());
  }
  for (int s = 0; s < kSaveAfter; ++s) zero_step(zero, ref, s);
  EXPECT_GT(max_abs_diff(zero.parameters(), initial), 1e-3) << "training did not move them";
  EXPECT_EQ(max_diff_across_ranks(zero.parameters()), 0.0);

  const std::string fix = "consolidate_state_dict(" + std::to_string(rank) + ")";
  expect_invalid_argument([&] { zero.state_dict(); }, fix);
  zero.consolidate_state_dict(to);
  if (rank != to) {
    expect_invalid_argument([&] { zero.state_dict(); }, fix);
  } else {
    const auto sd = zero.state_dict();
    expect_state_of_reference(sd, ref);
    expect_groups_of_reference(sd, ref, {{0, 1, 2, 3, 4, 5, 6}});
    EXPECT_DOUBLE_EQ(sd.param_groups[0]["lr"].get<double>(),
                     ref.opt->param_groups()[0].options().get_lr());
    tdist::Object::Dict file;
    tdist::Object::List params;
    for (const auto& p : zero.parameters()) params.emplace_back(p.detach());
    tdist::Object::Dict state;
    for (const auto& [key, t] : sd.state) state[key] = t.local;
    file["params"] = params;
    file["state"] = state;
    file["param_groups"] = sd.param_groups.dump();
    const auto bytes = tdist::serialize_object(tdist::Object(file));
    std::ofstream(state_file(), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  tdist::destroy_process_group();
}

/// Loads what zero_train_and_save saved (another world size) into a fresh optimizer built
/// with the original lr, and continues exactly as the reference does.
TDIST_SCENARIO(zero_load_and_resume) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  std::ifstream in(state_file(), std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  const auto file = tdist::deserialize_object(bytes);
  std::vector<at::Tensor> params;
  for (const auto& p : file.at("params").as_list())
    params.push_back(p.as_tensor().clone().requires_grad_(true));
  ddp::ZeroStateDict sd;
  for (const auto& [key, t] : file.at("state").as_dict())
    sd.state[key] = tdist::ShardedTensor::whole(t.as_tensor());
  sd.param_groups = json::parse(file.at("param_groups").as_string());

  const auto initial = make_params();
  Reference ref(initial, opt_kind(), initial.size());
  for (int s = 0; s < kSaveAfter; ++s) {
    if (s == 3) halve_lr(*ref.opt);
    ref.step(s);
  }
  ASSERT_LE(max_abs_diff(params, ref.params), kTol)
      << "the saved parameters are not step " << kSaveAfter << "'s";

  ddp::ZeroRedundancyOptimizer zero(params, make_factory(opt_kind()), zero_options());
  zero.load_state_dict(sd);
  for (const auto& g : zero.local_optimizer()->param_groups()) {
    EXPECT_DOUBLE_EQ(g.options().get_lr(), ref.opt->param_groups()[0].options().get_lr())
        << "the lr was not restored";
  }
  // Consolidated again, the loaded state comes back unchanged.
  zero.consolidate_state_dict(0);
  if (rank == 0) {
    const auto again = zero.state_dict();
    EXPECT_EQ(again.param_groups, sd.param_groups);
    ASSERT_EQ(again.state.size(), sd.state.size());
    for (const auto& [key, t] : sd.state) {
      ASSERT_TRUE(again.state.count(key)) << key;
      EXPECT_TRUE(at::equal(again.state.at(key).local.to(t.local.scalar_type()), t.local)) << key;
    }
  }
  for (int s = kSaveAfter; s < kSaveAfter + kResumeSteps; ++s) zero_step(zero, ref, s);
  EXPECT_EQ(max_diff_across_ranks(zero.parameters()), 0.0);
  zero.consolidate_state_dict(world - 1);
  if (rank == world - 1) expect_state_of_reference(zero.state_dict(), ref);
  tdist::destroy_process_group();
}

/// Groups added after some steps (one with its own options, one with the factory's) are
/// partitioned without moving earlier parameters and step as a single process's would.
TDIST_SCENARIO(zero_add_param_group) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  const auto initial = make_params();
  Reference ref(initial, "adam", 3);
  auto params = clone_params(initial);
  ddp::ZeroRedundancyOptimizer zero(std::vector<at::Tensor>(params.begin(), params.begin() + 3),
                                    make_factory("adam"), zero_options());
  // The parameters not yet added get gradients too, which nobody applies.
  auto step = [&](int s) {
    set_grads(params, s);
    zero.step();
    zero.zero_grad();
    ref.step(s);
    EXPECT_LE(max_abs_diff(params, ref.params), kTol) << "rank " << rank << " step " << s;
  };
  for (int s = 0; s < 3; ++s) step(s);
  EXPECT_TRUE(at::equal(params[5], initial[5]));

  std::vector<int> owners;
  for (size_t i = 0; i < 3; ++i) owners.push_back(zero.owner(i));
  const auto options = torch::optim::AdamOptions(0.05).weight_decay(0.01).amsgrad(true);
  zero.add_param_group(OptimizerParamGroup({params[3], params[4]},
                                           std::make_unique<torch::optim::AdamOptions>(options)));
  ref.opt->add_param_group(OptimizerParamGroup(
      {ref.params[3], ref.params[4]}, std::make_unique<torch::optim::AdamOptions>(options)));
  zero.add_param_group(OptimizerParamGroup({params[5], params[6]}));
  ref.opt->add_param_group(OptimizerParamGroup({ref.params[5], ref.params[6]}));
  ASSERT_EQ(zero.parameters().size(), 7u);
  EXPECT_EQ(zero.param_groups(), (std::vector<std::vector<size_t>>{{0, 1, 2}, {3, 4}, {5, 6}}));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(zero.owner(i), owners[i]) << "parameter " << i;
  EXPECT_EQ(zero.local_optimizer()->param_groups().size(), 3u);
  if (zero_options().parameters_as_bucket_view()) expect_bucket_views(zero);

  for (int s = 3; s < 8; ++s) step(s);
  EXPECT_GT(max_abs_diff({params[5]}, {initial[5]}), 1e-3) << "the added group was not stepped";
  EXPECT_EQ(max_diff_across_ranks(params), 0.0);
  zero.consolidate_state_dict(0);
  if (rank == 0) {
    const auto sd = zero.state_dict();
    expect_state_of_reference(sd, ref);
    expect_groups_of_reference(sd, ref, {{0, 1, 2}, {3, 4}, {5, 6}});
    EXPECT_DOUBLE_EQ(sd.param_groups[1]["lr"].get<double>(), 0.05);
    EXPECT_DOUBLE_EQ(sd.param_groups[2]["lr"].get<double>(), kLr);
  }
  (void)world;
  tdist::destroy_process_group();
}

/// Every misuse raises InvalidArgument on every rank, naming the problem, and leaves the
/// optimizer usable.
TDIST_SCENARIO(zero_misuse) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  const auto initial = make_params();
  expect_invalid_argument(
      [&] {
        ddp::ZeroRedundancyOptimizer z(
            clone_params(initial), make_factory("adam"),
            ddp::ZeroRedundancyOptimizerOptions().overlap_with_ddp(true));
      },
      "overlap_with_ddp is not provided");
  // Rank 1 passes another shape: every rank refuses before partitioning.
  if (world > 1) {
    auto differing = clone_params(initial);
    if (rank == 1) differing[2] = torch::zeros({3}, torch::requires_grad());
    expect_invalid_argument(
        [&] { ddp::ZeroRedundancyOptimizer z(differing, make_factory("adam")); }, "group rank 1");
  }

  auto params = clone_params(initial);
  ddp::ZeroRedundancyOptimizer zero(params, make_factory("adam"));
  set_grads(params, 0);
  zero.step();
  expect_invalid_argument([&] { zero.consolidate_state_dict(world); },
                          "to=" + std::to_string(world) + " is not a rank");
  expect_invalid_argument([&] { zero.consolidate_state_dict(-1); }, "is not a rank");

  // Bad state dicts (the same on every rank): refused before anything changes.
  auto good = [&] {
    ddp::ZeroStateDict sd;
    sd.param_groups = json::array({json{{"lr", 0.5}, {"params", {0, 1, 2, 3, 4, 5, 6}}}});
    sd.state["0.exp_avg"] = tdist::ShardedTensor::whole(torch::zeros({5, 3}));
    return sd;
  };
  auto sd = good();
  sd.state["0.exp_avg"] = tdist::ShardedTensor::whole(torch::zeros({3, 5}));
  expect_invalid_argument([&] { zero.load_state_dict(sd); }, "has shape [3, 5], parameter 0");
  sd = good();
  sd.param_groups.push_back(json{{"params", json::array()}});
  expect_invalid_argument([&] { zero.load_state_dict(sd); }, "the state dict has 2 param groups");
  sd = good();
  sd.param_groups[0]["params"] = {0, 1, 2};
  expect_invalid_argument([&] { zero.load_state_dict(sd); }, "has 3 parameters in the state");
  sd = good();
  sd.state["0.momentum_buffer"] = tdist::ShardedTensor::whole(torch::zeros({5, 3}));
  expect_invalid_argument([&] { zero.load_state_dict(sd); }, "does not keep");
  sd = good();
  sd.state["9.step"] = tdist::ShardedTensor::whole(torch::tensor(3));
  expect_invalid_argument([&] { zero.load_state_dict(sd); }, "parameter index 9");
  sd = good();
  sd.param_groups[0]["lr"] = "fast";
  expect_invalid_argument([&] { zero.load_state_dict(sd); }, "'lr' must be a number");
  sd = good();
  sd.param_groups[0]["betas"] = {0.9};
  expect_invalid_argument([&] { zero.load_state_dict(sd); }, "'betas' must be a list of 2");
  EXPECT_DOUBLE_EQ(zero.local_optimizer()->param_groups()[0].options().get_lr(), kLr)
      << "a refused load changed the lr";

  // add_param_group misuse.
  expect_invalid_argument([&] { zero.add_param_group(OptimizerParamGroup({params[1]})); },
                          "already parameter 1");
  const auto extra = torch::ones({4}, torch::requires_grad());
  expect_invalid_argument([&] { zero.add_param_group(OptimizerParamGroup({extra * 2})); },
                          "not a leaf");
  expect_invalid_argument(
      [&] {
        zero.add_param_group(
            OptimizerParamGroup({extra}, std::make_unique<torch::optim::SGDOptions>(0.1)));
      },
      "another optimizer type");
  if (world > 1) {
    const auto mismatched = torch::ones({rank == 1 ? 5 : 4}, torch::requires_grad());
    expect_invalid_argument([&] { zero.add_param_group(OptimizerParamGroup({mismatched})); },
                            "on group rank 1");
  }
  EXPECT_EQ(zero.param_groups().size(), 1u);

  // Still in step across ranks: a good load, then consolidate to the last rank.
  zero.load_state_dict(good());
  EXPECT_DOUBLE_EQ(zero.local_optimizer()->param_groups()[0].options().get_lr(), 0.5);
  zero.consolidate_state_dict(world - 1);
  if (rank == world - 1) {
    // Parameters the state dict has no state for start afresh; parameter 0 has exp_avg (and
    // the step its state starts with).
    const auto state = zero.state_dict().state;
    ASSERT_EQ(state.size(), 2u);
    EXPECT_TRUE(at::equal(state.at("0.exp_avg").local, torch::zeros({5, 3})));
    EXPECT_EQ(state.at("0.step").local.item<int64_t>(), 0);
  } else {
    expect_invalid_argument([&] { zero.state_dict(); }, "has not been consolidated");
  }
  tdist::destroy_process_group();
}

ProcessOptions process_options(std::map<std::string, std::string> env) {
  ProcessOptions options;
  options.env = std::move(env);
  options.timeout = std::chrono::seconds(90);
  return options;
}

TEST(ZeroPartition, GroupsShareTheLoad) {
  // Group 0: 10->r0, 1->r1 (loads 10, 1). Group 1 largest first: 5->r1 (6), 5->r1 (11),
  // 3->r0 (13).
  auto parts = ddp::detail::partition_parameter_groups({{10, 1}, {5, 5, 3}}, 2);
  EXPECT_EQ(parts, (std::vector<std::vector<size_t>>{{0, 4}, {1, 2, 3}}));
  EXPECT_EQ(ddp::detail::partition_parameter_groups({{10, 1, 7, 3, 5}}, 3),
            ddp::detail::partition_parameters({10, 1, 7, 3, 5}, 3));
}

TEST(ZeroPartition, AppendingAGroupKeepsEveryOwner) {
  std::vector<std::vector<int64_t>> groups;
  for (int g = 0; g < 5; ++g) {
    groups.emplace_back();
    for (int i = 0; i < 4 + g; ++i) groups.back().push_back((g * 31 + i * 17) % 23 + 1);
  }
  for (int world : {1, 2, 3, 4}) {
    for (size_t n = 1; n < groups.size(); ++n) {
      std::vector<std::vector<int64_t>> prefix(groups.begin(), groups.begin() + n);
      auto before = ddp::detail::partition_parameter_groups(prefix, world);
      prefix.push_back(groups[n]);
      auto after = ddp::detail::partition_parameter_groups(prefix, world);
      for (int r = 0; r < world; ++r) {
        for (auto i : before[r]) {
          EXPECT_NE(std::find(after[r].begin(), after[r].end(), i), after[r].end())
              << "world " << world << ": parameter " << i << " left rank " << r;
        }
      }
    }
  }
}

class ZeroSaveResume
    : public ::testing::TestWithParam<std::tuple<std::string, int, bool, int, bool>> {};

TEST_P(ZeroSaveResume, ContinuesAsOneProcessAtAnotherWorldSize) {
  const auto& [opt, save_world, save_buckets, load_world, load_buckets] = GetParam();
  const std::string dir = make_temp_dir("tdist-zero");
  expect_all_ok(
      run_ranks_as_processes("zero_train_and_save", save_world,
                             process_options({{"TDIST_ZERO_OPT", opt},
                                              {"TDIST_ZERO_DIR", dir},
                                              {"TDIST_ZERO_BUCKETS", save_buckets ? "1" : "0"}})));
  expect_all_ok(
      run_ranks_as_processes("zero_load_and_resume", load_world,
                             process_options({{"TDIST_ZERO_OPT", opt},
                                              {"TDIST_ZERO_DIR", dir},
                                              {"TDIST_ZERO_BUCKETS", load_buckets ? "1" : "0"}})));
}

INSTANTIATE_TEST_SUITE_P(Worlds, ZeroSaveResume,
                         ::testing::Values(std::make_tuple("adam", 1, false, 3, false),
                                           std::make_tuple("adam", 2, false, 4, true),
                                           std::make_tuple("adam", 3, true, 2, false),
                                           std::make_tuple("adam", 4, false, 1, false),
                                           std::make_tuple("sgd", 3, false, 2, true),
                                           std::make_tuple("tdist_adam", 2, true, 3, false)),
                         [](const auto& info) {
                           const auto& p = info.param;
                           return std::get<0>(p) + "_world" + std::to_string(std::get<1>(p)) +
                                  (std::get<2>(p) ? "buckets" : "") + "_to_world" +
                                  std::to_string(std::get<3>(p)) +
                                  (std::get<4>(p) ? "buckets" : "");
                         });

TEST(ZeroAddParamGroup, MatchesOneProcessAtWorlds1To4) {
  expect_all_ok_at_worlds("zero_add_param_group", {1, 2, 3, 4}, process_options({}));
}

TEST(ZeroAddParamGroup, WithBucketViewsAtWorld3) {
  expect_all_ok_at_worlds("zero_add_param_group", {3},
                          process_options({{"TDIST_ZERO_BUCKETS", "1"}}));
}

TEST(ZeroMisuse, RaisedOnEveryRank) {
  expect_all_ok_at_worlds("zero_misuse", {1, 2, 3}, process_options({}));
}

}  // namespace

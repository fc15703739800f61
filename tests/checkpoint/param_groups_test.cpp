// Optimizer param groups in checkpoints: a run saves with lr, betas, weight decay and the
// other per-group options unlike those a fresh optimizer is built with; load_module restores
// them, in tdist's format and in PyTorch's DCP format, at world 1 and FSDP-sharded at world 3.
// A checkpoint with another number of groups than the optimizer is refused naming both.
// (Python's side, dcp.load + set_optimizer_state_dict, is in dcp_interop_test.cpp.)

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <torch/torch.h>

#include "support/ranks.h"
#include "tdist/checkpoint/module_state.h"
#include "tdist/checkpoint/optimizer_param_groups.h"
#include "tdist/comm/distributed.h"
#include "tdist/error.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/optim/adam.h"
#include "tdist/optim/sgd.h"

namespace tdist::checkpoint {
namespace {

using tdist::testing::env_str;

struct PgNetImpl : torch::nn::Module {
  PgNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 7));  // 7 rows: uneven shards at 3
    fc2 = register_module("fc2", torch::nn::Linear(7, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fsdp::forward(fc2, torch::relu(fsdp::forward(fc1, x)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(PgNet);

void shard(PgNet& m) {
  fsdp::fully_shard(m->fc1);
  fsdp::fully_shard(m->fc2);
  fsdp::fully_shard(m);
}

std::vector<torch::optim::OptimizerParamGroup> two_groups(PgNet& m, const optim::AdamWOptions& a,
                                                          const optim::AdamWOptions& b) {
  return {torch::optim::OptimizerParamGroup(m->fc1->parameters(), a.clone()),
          torch::optim::OptimizerParamGroup(m->fc2->parameters(), b.clone())};
}

/// AdamW with two groups whose options all differ from the defaults.
std::unique_ptr<optim::AdamW> tuned_adamw(PgNet& m) {
  return std::make_unique<optim::AdamW>(
      two_groups(m,
                 optim::AdamWOptions(0.02)
                     .betas({0.8, 0.95})
                     .eps(1e-6)
                     .weight_decay(0.05)
                     .amsgrad(true)
                     .implementation(optim::Implementation::kForLoop),
                 optim::AdamWOptions(0.003).weight_decay(0.2).maximize(true).implementation(
                     optim::Implementation::kForeach)),
      optim::AdamWOptions(0.5));
}

/// What a resuming run builds before loading: the same groups, default options.
std::unique_ptr<optim::AdamW> fresh_adamw(PgNet& m) {
  return std::make_unique<optim::AdamW>(two_groups(m, optim::AdamWOptions(), optim::AdamWOptions()),
                                        optim::AdamWOptions());
}

void train_step(PgNet& m, torch::optim::Optimizer& opt) {
  torch::manual_seed(300);
  opt.zero_grad();
  fsdp::forward(m, torch::randn({4, 5})).square().mean().backward();
  opt.step();
}

SaveOptions options_for(const std::string& format) {
  return SaveOptions().fsync(false).format(format == "dcp" ? CheckpointFormat::kDCP
                                                           : CheckpointFormat::kTdist);
}

// PG_WORLD ranks: FSDP, the tuned AdamW, one step; saved in both formats under PG_DIR; rank 0
// writes the groups it saved to PG_DIR/groups.json.
TDIST_SCENARIO(pg_fsdp_save) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("PG_DIR");
  torch::manual_seed(5);
  PgNet m;
  shard(m);
  auto opt = tuned_adamw(m);
  train_step(m, *opt);
  save_module(*m, opt.get(), {}, dir + "/tdist", options_for("tdist"));
  save_module(*m, opt.get(), {}, dir + "/dcp", options_for("dcp"));
  if (get_rank() == 0) std::ofstream(dir + "/groups.json") << optimizer_param_groups(*m, *opt);
  destroy_process_group();
}

nlohmann::json saved_groups(const std::string& dir) {
  std::ifstream in(dir + "/groups.json");
  return nlohmann::json::parse(in);
}

// Loads PG_DIR/<PG_FORMAT> into a fresh FSDP model and default-built AdamW; the groups equal
// the saved ones, and a step runs with them.
TDIST_SCENARIO(pg_fsdp_load) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("PG_DIR");
  PgNet m;
  shard(m);
  auto opt = fresh_adamw(m);
  load_module(*m, opt.get(), dir + "/" + env_str("PG_FORMAT"));
  EXPECT_EQ(optimizer_param_groups(*m, *opt), saved_groups(dir)) << "rank " << get_rank();
  EXPECT_EQ(opt->implementation(0), optim::Implementation::kForLoop);
  train_step(m, *opt);
  destroy_process_group();
}

TEST(OptimizerParamGroups, SavedFromFsdpAtThreeRestoredAtThreeAndOneInBothFormats) {
  const std::string dir = tdist::testing::make_temp_dir("pg");
  tdist::testing::ProcessOptions options;
  options.env = {{"PG_DIR", dir}};
  tdist::testing::expect_all_ok(tdist::testing::run_ranks_as_processes("pg_fsdp_save", 3, options));
  const nlohmann::json want = saved_groups(dir);
  ASSERT_EQ(want.size(), 2u);
  EXPECT_EQ(want[0].at("lr"), 0.02);
  EXPECT_EQ(want[0].at("betas"), nlohmann::json({0.8, 0.95}));
  EXPECT_EQ(want[0].at("params"), nlohmann::json({"fc1.weight", "fc1.bias"}));
  EXPECT_EQ(want[1].at("maximize"), true);
  EXPECT_EQ(want[1].at("foreach"), true);
  for (const char* format : {"tdist", "dcp"}) {
    SCOPED_TRACE(format);
    options.env = {{"PG_DIR", dir}, {"PG_FORMAT", format}};
    tdist::testing::expect_all_ok(
        tdist::testing::run_ranks_as_processes("pg_fsdp_load", 3, options));
    PgNet m;  // world 1: a plain model in this process
    auto opt = fresh_adamw(m);
    const LoadResult r = load_module(*m, opt.get(), dir + "/" + format);
    EXPECT_EQ(r.extra.optimizer_param_groups, want);
    EXPECT_EQ(optimizer_param_groups(*m, *opt), want);
    const auto& g1 = static_cast<const optim::AdamWOptions&>(opt->param_groups()[1].options());
    EXPECT_EQ(g1.lr(), 0.003);
    EXPECT_EQ(g1.weight_decay(), 0.2);
    EXPECT_TRUE(g1.maximize());
    EXPECT_EQ(g1.implementation(), optim::Implementation::kForeach);
  }
}

/// Saves `saved` at world 1 in `format`, loads into `fresh`; the groups must come back.
void expect_round_trip(PgNet& m, torch::optim::Optimizer& saved, torch::optim::Optimizer& fresh,
                       const std::string& format) {
  SCOPED_TRACE(format);
  const std::string dir = tdist::testing::make_temp_dir("pg1") + "/ckpt";
  train_step(m, saved);
  const nlohmann::json want = optimizer_param_groups(*m, saved);
  ASSERT_NE(optimizer_param_groups(*m, fresh), want) << "the test needs other options";
  save_module(*m, &saved, {}, dir, options_for(format));
  load_module(*m, &fresh, dir);
  EXPECT_EQ(optimizer_param_groups(*m, fresh), want);
}

TEST(OptimizerParamGroups, EveryOptionOfSgdAdamAdagradRmspropRoundTripsAtOne) {
  namespace o = torch::optim;
  for (const char* format : {"tdist", "dcp"}) {
    PgNet m;
    {
      optim::SGD saved(m->parameters(), optim::SGDOptions(0.3)
                                            .momentum(0.7)
                                            .dampening(0.1)
                                            .weight_decay(0.01)
                                            .maximize(true)
                                            .implementation(optim::Implementation::kForeach));
      optim::SGD fresh(m->parameters(), optim::SGDOptions(0.1));
      expect_round_trip(m, saved, fresh, format);
      EXPECT_TRUE(
          static_cast<const optim::SGDOptions&>(fresh.param_groups()[0].options()).maximize());
    }
    {
      optim::SGD saved(m->parameters(), optim::SGDOptions(0.3).momentum(0.7).nesterov(true));
      optim::SGD fresh(m->parameters(), optim::SGDOptions(0.1));
      expect_round_trip(m, saved, fresh, format);
    }
    {
      o::Adam saved(
          m->parameters(),
          o::AdamOptions(0.04).betas({0.7, 0.9}).eps(1e-5).weight_decay(0.1).amsgrad(true));
      o::Adam fresh(m->parameters(), o::AdamOptions());
      expect_round_trip(m, saved, fresh, format);
    }
    {
      o::Adagrad saved(m->parameters(), o::AdagradOptions(0.2).lr_decay(0.01).weight_decay(0.1));
      o::Adagrad fresh(m->parameters(), o::AdagradOptions());
      expect_round_trip(m, saved, fresh, format);
    }
    {
      o::RMSprop saved(m->parameters(),
                       o::RMSpropOptions(0.05).alpha(0.9).momentum(0.3).centered(true));
      o::RMSprop fresh(m->parameters(), o::RMSpropOptions());
      expect_round_trip(m, saved, fresh, format);
    }
  }
}

TEST(OptimizerParamGroups, AnotherNumberOfGroupsIsRefusedNamingBothCounts) {
  for (const char* format : {"tdist", "dcp"}) {
    SCOPED_TRACE(format);
    PgNet m;
    auto saved = tuned_adamw(m);
    const std::string dir = tdist::testing::make_temp_dir("pg-bad") + "/ckpt";
    save_module(*m, saved.get(), {}, dir, options_for(format));
    optim::AdamW one_group(m->parameters(), optim::AdamWOptions());
    try {
      load_module(*m, &one_group, dir);
      ADD_FAILURE() << "loaded 2 param groups into an optimizer with 1";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("has 2 optimizer param groups, the optimizer 1"),
                std::string::npos)
          << e.what();
    }
  }
  // The JSON form directly: wrong count, a group naming other parameters, a wrong type.
  PgNet m;
  auto opt = fresh_adamw(m);
  nlohmann::json groups = optimizer_param_groups(*m, *opt);
  EXPECT_THROW(set_optimizer_param_groups(*m, *opt, nlohmann::json::array({groups[0]})),
               InvalidArgument);
  nlohmann::json swapped = groups;
  std::swap(swapped[0]["params"], swapped[1]["params"]);
  EXPECT_THROW(set_optimizer_param_groups(*m, *opt, swapped), InvalidArgument);
  nlohmann::json bad = groups;
  bad[0]["lr"] = "fast";
  EXPECT_THROW(set_optimizer_param_groups(*m, *opt, bad), InvalidArgument);
}

}  // namespace
}  // namespace tdist::checkpoint

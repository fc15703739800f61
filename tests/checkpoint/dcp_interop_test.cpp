// torch.distributed.checkpoint interchange with the Python PyTorch of the build environment,
// at different world sizes on the two sides: tdist's FSDP saves at world 3 and Python's
// dcp.load reads it into a plain model and into FSDP2 at world 2 (and dcp_to_torch_save
// converts it); Python saves from a plain model, FSDP2 at world 2 and DDP at world 2, and
// tdist loads each into a plain model and into FSDP at world 3, parameters and Adam state
// bitwise equal to Python's full state. The model is the same on both sides
// (python/dcp_interop.py's Mlp): 7 rows shard unevenly at 2 and 3. Both sides train with
// Adam options unlike a fresh Adam's (kParamGroup, Python's PARAM_GROUP); the loading side
// builds Adam(lr=0.01) and gets the saved param groups back (Python through dcp.load +
// set_optimizer_state_dict, tdist through load_module).

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include "support/expect.h"
#include "support/ranks.h"
#include "support/tensors.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/checkpoint/metadata.h"
#include "tdist/checkpoint/module_state.h"
#include "tdist/comm/distributed.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/fully_shard.h"
#include "tdist/fsdp/state_dict.h"

namespace tdist::checkpoint {
namespace {

using tdist::testing::bitwise_equal;
using tdist::testing::env_str;

struct DCPMlpImpl : torch::nn::Module {
  DCPMlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 7));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({7})));
    fc2 = register_module("fc2", torch::nn::Linear(7, 3));
    scale = register_parameter("scale", torch::full({1}, 1.5));
  }
  torch::Tensor forward(const torch::Tensor& x) {  // sharded children run through FSDP's hooks
    const auto h = torch::relu(norm(fsdp::forward(fc1, x)));
    return fsdp::forward(fc2, h) * scale;
  }
  torch::nn::Linear fc1{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(DCPMlp);

using tdist::testing::test_python;

/// The saving runs' Adam options: python/dcp_interop.py's PARAM_GROUP.
torch::optim::AdamOptions kParamGroup() {
  return torch::optim::AdamOptions(0.02)
      .betas({0.8, 0.95})
      .eps(1e-6)
      .weight_decay(0.05)
      .amsgrad(true);
}

void expect_param_group_restored(const torch::optim::Optimizer& opt, const std::string& what) {
  ASSERT_EQ(opt.param_groups().size(), 1u) << what;
  const auto& got = static_cast<const torch::optim::AdamOptions&>(opt.param_groups()[0].options());
  const auto want = kParamGroup();
  EXPECT_EQ(got.lr(), want.lr()) << what;
  EXPECT_EQ(got.betas(), want.betas()) << what;
  EXPECT_EQ(got.eps(), want.eps()) << what;
  EXPECT_EQ(got.weight_decay(), want.weight_decay()) << what;
  EXPECT_EQ(got.amsgrad(), want.amsgrad()) << what;
}

/// Why Python cannot take part, or "" when it can (PyTorch >= 2.6: FSDP2 and DCP's
/// state_dict helpers).
std::string python_unavailable() {
  static const std::string why = [] {
    const std::string probe =
        test_python() +
        " -c 'from torch.distributed.fsdp import fully_shard; "
        "import torch.distributed.checkpoint.state_dict, torch.distributed.checkpoint.format_utils'"
        " >/dev/null 2>&1";
    return std::system(probe.c_str()) == 0
               ? std::string()
               : test_python() +
                     " has no PyTorch with fully_shard and torch.distributed.checkpoint";
  }();
  return why;
}

/// Runs python/dcp_interop.py; expects it to succeed.
void run_python(const std::vector<std::string>& args) {
  const std::string dir = tdist::testing::make_temp_dir("dcp-py");
  std::string cmd = test_python() + " " + DCP_INTEROP_PY;
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " >" + dir + "/out.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(dir + "/out.txt");
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_NE(out.find("OK " + args[0]), std::string::npos) << out;
}

void shard(DCPMlp& m) {
  fsdp::fully_shard(m->fc1);
  fsdp::fully_shard(m->fc2);
  fsdp::fully_shard(m);
}

/// The model's (and, unless the checkpoint has none, Adam's) full state equals ref.pt.
void expect_matches_python_reference(const torch::nn::Module& m, torch::optim::Optimizer& opt,
                                     const std::string& ref_file, bool with_optimizer,
                                     const std::string& what) {
  const TensorMap ref = import_torch_file(ref_file);
  const auto full = fsdp::StateDictOptions().full_state_dict(true);
  int compared = 0;
  for (const auto& [name, st] : fsdp::get_model_state_dict(m, full)) {
    ASSERT_TRUE(ref.count(kModelPrefix + name)) << what << ": " << name;
    EXPECT_TRUE(bitwise_equal(st.local, ref.at(kModelPrefix + name))) << what << ": " << name;
    ++compared;
  }
  EXPECT_EQ(compared, 7) << what;
  if (!with_optimizer) return;
  for (const auto& [name, st] : fsdp::get_optimizer_state_dict(m, opt, full)) {
    const at::Tensor& want = ref.at(kOptimPrefix + name);
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".step") == 0) {
      EXPECT_EQ(st.local.item<double>(), want.item<double>()) << what << ": " << name;
    } else {
      EXPECT_TRUE(bitwise_equal(st.local, want)) << what << ": " << name;
    }
    ++compared;
  }
  EXPECT_EQ(compared, 7 * 5) << what << ": exp_avg, exp_avg_sq, max_exp_avg_sq and step";
  expect_param_group_restored(opt, what);
}

// FSDP at this world size, one Adam step, saved in the DCP format into CK_DIR/ckpt; the full
// state, as tdist names it, into CK_DIR/ref.pt for Python to compare with.
TDIST_SCENARIO(dcp_tdist_save) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("CK_DIR");
  torch::manual_seed(11);
  DCPMlp m;
  shard(m);
  torch::optim::Adam opt(m->parameters(), kParamGroup());
  torch::manual_seed(200 + get_rank());
  fsdp::forward(m, torch::randn({4, 5})).square().mean().backward();
  opt.step();
  save_module(*m, &opt, {}, dir + "/ckpt",
              SaveOptions().fsync(false).format(CheckpointFormat::kDCP));
  TensorMap ref;
  for (const auto& [name, t] : module_tensors(*m)) ref[kModelPrefix + name] = t;  // collective
  const auto full = fsdp::StateDictOptions().full_state_dict(true);
  for (const auto& [name, st] : fsdp::get_optimizer_state_dict(*m, opt, full)) {
    ref[kOptimPrefix + name] = st.local;
  }
  if (get_rank() == 0) export_torch_file(ref, dir + "/ref.pt");
  destroy_process_group();
}

// Loads Python's CK_DIR/ckpt into a fresh FSDP model at this world size.
TDIST_SCENARIO(dcp_tdist_load) {
  init_process_group(InitProcessGroupOptions().backend("gloo"));
  const std::string dir = env_str("CK_DIR");
  DCPMlp m;
  shard(m);
  torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(0.01));
  load_module(*m, &opt, dir + "/ckpt");
  expect_matches_python_reference(*m, opt, dir + "/ref.pt", true,
                                  "fsdp rank " + std::to_string(get_rank()));
  destroy_process_group();
}

TEST(DCPInterop, PythonLoadsWhatTdistsFsdpSavedAtThree) {
  if (!python_unavailable().empty()) GTEST_SKIP() << python_unavailable();
  const std::string dir = tdist::testing::make_temp_dir("dcp");
  tdist::testing::ProcessOptions options;
  options.env = {{"CK_DIR", dir}};
  tdist::testing::expect_all_ok(
      tdist::testing::run_ranks_as_processes("dcp_tdist_save", 3, options));
  run_python({"load", "plain", dir, "1"});
  run_python({"load", "fsdp2", dir, "2"});
}

TEST(DCPInterop, TdistLoadsPythonsPlainFsdp2AndDdpCheckpoints) {
  if (!python_unavailable().empty()) GTEST_SKIP() << python_unavailable();
  struct Case {
    const char* kind;
    const char* world;
    bool with_optimizer;  // raw DDP state_dict(): the model only
  };
  for (const Case& c :
       {Case{"plain", "1", true}, Case{"fsdp2", "2", true}, Case{"ddp", "2", false}}) {
    SCOPED_TRACE(std::string(c.kind) + " at world " + c.world);
    const std::string dir = tdist::testing::make_temp_dir("dcp");
    run_python({"save", c.kind, dir, c.world});
    {  // into a plain model in this (uninitialised) process
      DCPMlp m;
      torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(0.01));
      const LoadResult r = load_module(*m, c.with_optimizer ? &opt : nullptr, dir + "/ckpt");
      EXPECT_TRUE(r.missing_keys.empty());
      expect_matches_python_reference(*m, opt, dir + "/ref.pt", c.with_optimizer, "plain");
    }
    {  // ckpt-inspect --export ... dcp rewrites it whole, from one process; it loads the same
      const std::string again = dir + "/again";
      const std::string cmd = std::string(CKPT_INSPECT_BIN) + " --export " + dir + "/ckpt dcp " +
                              again + " >" + dir + "/inspect.txt 2>&1";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
      EXPECT_EQ(read_metadata(again).world_size, 1);
      DCPMlp m;
      torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(0.01));
      load_module(*m, c.with_optimizer ? &opt : nullptr, again);
      expect_matches_python_reference(*m, opt, dir + "/ref.pt", c.with_optimizer,
                                      "ckpt-inspect --export dcp");
    }
    if (c.with_optimizer) {
      tdist::testing::ProcessOptions options;
      options.env = {{"CK_DIR", dir}};
      tdist::testing::expect_all_ok(
          tdist::testing::run_ranks_as_processes("dcp_tdist_load", 3, options));
    }
  }
}

}  // namespace
}  // namespace tdist::checkpoint

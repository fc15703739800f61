// torch.distributed.checkpoint interchange of 2-D (FSDP over tensor parallelism) checkpoints
// with the PyTorch of the build environment, on the CPU. Both sides train the model
// python/tp_dcp_oracle.py makes (a transformers Llama whose vocabulary and MLP parts shard
// unevenly over dp) in float64 at (dp 2, tp 2): fully_shard on each decoder layer and the
// root over dp, AdamW, dp rank r on input rows chunk r. tdist runs its default plan (sequence
// parallel), PyTorch hf_oracle.llama_tp_plan: they place every parameter alike, which is all
// a checkpoint holds. PyTorch's checkpoint loads into tdist at (dp 2, tp 2), (dp 1, tp 2) and
// in one process: parameters equal PyTorch's bitwise, and the next step equals PyTorch's next
// step (so the optimizer state and param group came across). tdist's loads into PyTorch at
// (dp 2, tp 2): parameters and optimizer state equal the single process's step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <map>
#include <optional>

#include "oracle.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/checkpoint/module_state.h"
#include "tdist/comm/distributed.h"
#include "tdist/fsdp/forward.h"
#include "tdist/fsdp/full_params.h"
#include "tdist/fsdp/state_dict.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/models/pretrained.h"
#include "tdist/models/tensor_parallel.h"
#include "tdist/tensor/parallel/parallelize.h"

namespace {

using namespace tdist::testing;
namespace models = tdist::models;
namespace ckpt = tdist::checkpoint;

constexpr double kLr = 1e-2;  // tp_dcp_oracle.py's LR

// One side of the interchange: the model in a layout ("dp2tp2" at world 4, "tp2" at world 2,
// "single" without parallelism), its AdamW and this rank's input rows.
struct Trainer {
  std::shared_ptr<models::CausalLM> model;
  std::optional<tdist::mesh::DeviceMesh> mesh;
  std::unique_ptr<torch::optim::AdamW> opt;
  at::Tensor rows;

  void step() {
    const at::Tensor logits = mesh ? tdist::fsdp::forward(model, rows) : model->forward(rows);
    models::causal_lm_loss(logits, rows).backward();
    opt->step();
    opt->zero_grad();
  }
};

Trainer make_trainer(const std::string& layout, const std::string& model_dir, double lr) {
  Trainer t;
  t.model = models::from_pretrained(model_dir, models::LoadOptions().dtype(at::kDouble));
  t.model->train();
  const at::Tensor ids = tensor_from(model_dir + "/inputs.safetensors", "input_ids");
  t.rows = ids;
  if (layout != "single") {
    const int64_t world = tdist::get_world_size();
    t.mesh = tdist::mesh::init_device_mesh("cpu", {world / 2, 2}, {"dp", "tp"});
    models::apply_tensor_parallel(t.model, (*t.mesh)["tp"]);
    models::fully_shard_model(t.model, tdist::fsdp::FullyShardOptions().mesh((*t.mesh)["dp"]));
    t.rows = ids.chunk(world / 2)[t.mesh->get_local_rank("dp")];
  }
  t.opt =
      std::make_unique<torch::optim::AdamW>(t.model->parameters(), torch::optim::AdamWOptions(lr));
  return t;
}

// Every parameter whole (gathered over dp, then tp), copied out of the summoned storage (a
// replicated parameter's full_tensor() is that storage); collective over the model's ranks.
std::map<std::string, at::Tensor> full_parameters(const Trainer& t) {
  std::optional<tdist::fsdp::SummonFullParams> full;
  if (t.mesh) full.emplace(*t.model, tdist::fsdp::SummonFullParamsOptions().writeback(false));
  std::map<std::string, at::Tensor> out;
  for (const auto& item : t.model->named_modules()) {
    const bool parallel = tdist::tensor::parallel::style_of(*item.value()) != nullptr;
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      const at::Tensor whole =
          parallel
              ? tdist::tensor::parallel::parameter_dtensor(*item.value(), p.key()).full_tensor()
              : p.value();
      out[item.key() + "." + p.key()] = whole.detach().clone();
    }
  }
  return out;
}

// Each parameter of `t` against `want`'s "model.<fqn>": bitwise, or within 1e-6 relative.
void expect_parameters(const Trainer& t, const ckpt::TensorMap& want, bool bitwise,
                       const std::string& what) {
  const auto got = full_parameters(t);
  for (const auto& [name, whole] : got) {
    auto it = want.find(ckpt::kModelPrefix + name);
    ASSERT_NE(it, want.end()) << what << ": PyTorch has no " << name;
    if (bitwise) {
      EXPECT_TRUE(whole.sizes() == it->second.sizes() && whole.equal(it->second))
          << what << ": " << name;
    } else {
      EXPECT_LE(relative_error(whole, it->second), 1e-6) << what << ": " << name;
    }
  }
  size_t want_params = 0;
  for (const auto& [name, value] : want) want_params += name.rfind(ckpt::kModelPrefix, 0) == 0;
  EXPECT_EQ(got.size(), want_params) << what;
}

// A single process's full optimizer state against `want`'s "optim.state.<fqn>.<key>".
void expect_optimizer_state(const Trainer& t, const ckpt::TensorMap& want) {
  const auto full = tdist::fsdp::StateDictOptions().full_state_dict(true);
  size_t compared = 0;
  for (const auto& [key, st] : tdist::fsdp::get_optimizer_state_dict(*t.model, *t.opt, full)) {
    auto it = want.find(ckpt::kOptimPrefix + key);
    ASSERT_NE(it, want.end()) << "PyTorch has no optimizer state " << key;
    if (st.local.dim() == 0) {  // step
      EXPECT_EQ(st.local.item<double>(), it->second.item<double>()) << key;
    } else {
      EXPECT_TRUE(st.local.equal(it->second)) << key;
    }
    ++compared;
  }
  size_t want_states = 0;
  for (const auto& [name, value] : want) want_states += name.rfind(ckpt::kOptimPrefix, 0) == 0;
  EXPECT_EQ(compared, want_states);
}

// Loads PyTorch's OUT_DIR/torch_ckpt in LAYOUT into an AdamW built with lr / 10: the saved
// lr comes back, parameters equal torch_ref.pt's, the next step torch_next.pt's.
TDIST_SCENARIO(tp_interop_load) {
  const std::string layout = env_str("LAYOUT"), out = env_str("OUT_DIR");
  tdist::init_process_group();
  Trainer t = make_trainer(layout, env_str("MODEL_DIR"), kLr / 10);
  const ckpt::LoadResult r = ckpt::load_module(*t.model, t.opt.get(), out + "/torch_ckpt");
  EXPECT_TRUE(r.missing_keys.empty());
  ASSERT_EQ(t.opt->param_groups().size(), 1u);
  EXPECT_EQ(t.opt->param_groups()[0].options().get_lr(), kLr);
  const ckpt::TensorMap ref = ckpt::import_torch_file(out + "/torch_ref.pt");
  expect_parameters(t, ref, /*bitwise=*/true, "loaded at " + layout);
  if (layout == "single") expect_optimizer_state(t, ref);
  t.step();
  expect_parameters(t, ckpt::import_torch_file(out + "/torch_next.pt"), /*bitwise=*/false,
                    "next step at " + layout);
  tdist::destroy_process_group();
}

// One step at (dp 2, tp 2), saved in the DCP format into OUT_DIR/tdist_ckpt; the single
// process's step (which the 2-D parameters must equal) into OUT_DIR/tdist_ref.pt for Python.
TDIST_SCENARIO(tp_interop_save) {
  const std::string model_dir = env_str("MODEL_DIR"), out = env_str("OUT_DIR");
  tdist::init_process_group();
  Trainer t = make_trainer("dp2tp2", model_dir, kLr);
  t.step();
  ckpt::save_module(*t.model, t.opt.get(), {}, out + "/tdist_ckpt",
                    ckpt::SaveOptions().fsync(false).format(ckpt::CheckpointFormat::kDCP));
  Trainer ref = make_trainer("single", model_dir, kLr);
  ref.step();
  ckpt::TensorMap want;
  for (const auto& [name, whole] : full_parameters(ref)) want[ckpt::kModelPrefix + name] = whole;
  expect_parameters(t, want, /*bitwise=*/false, "tdist at (dp 2, tp 2)");
  const auto full = tdist::fsdp::StateDictOptions().full_state_dict(true);
  for (const auto& [key, st] : tdist::fsdp::get_optimizer_state_dict(*ref.model, *ref.opt, full)) {
    want[ckpt::kOptimPrefix + key] = st.local;
  }
  if (tdist::get_rank() == 0) ckpt::export_torch_file(want, out + "/tdist_ref.pt");
  tdist::destroy_process_group();
}

// Why PyTorch cannot take part (transformers, FSDP2, tensor parallelism, DCP's state-dict
// helpers), or "" when it can.
std::string pytorch_unavailable() {
  static const std::string why = [] {
    if (!transformers_unavailable().empty()) return transformers_unavailable();
    const std::string probe = test_python() +
                              " -c 'from torch.distributed.fsdp import fully_shard; "
                              "from torch.distributed.tensor.parallel import parallelize_module; "
                              "import torch.distributed.checkpoint.state_dict' >/dev/null 2>&1";
    return std::system(probe.c_str()) == 0
               ? std::string()
               : test_python() +
                     " has no PyTorch with fully_shard, tensor parallelism and "
                     "torch.distributed.checkpoint's state_dict helpers";
  }();
  return why;
}

// The model both sides train, made once per test process.
const std::string& interop_model() {
  static const std::string dir = [] {
    const std::string d = make_temp_dir("hf-llama_tp_dcp") + "/model";
    run_oracle_script(TP_DCP_ORACLE_PY, {"make", d});
    return d;
  }();
  return dir;
}

ProcessOptions interop_options(const std::string& out) {
  ProcessOptions options;
  options.timeout = std::chrono::seconds(180);
  options.env = {{"MODEL_DIR", interop_model()}, {"OUT_DIR", out}};
  return options;
}

TEST(TensorParallelInterop, TdistLoadsPyTorchsDp2Tp2CheckpointAtEveryLayout) {
  if (!pytorch_unavailable().empty()) GTEST_SKIP() << pytorch_unavailable();
  const std::string out = make_temp_dir("tp-interop");
  run_oracle_script(TP_DCP_ORACLE_PY, {"save", interop_model(), out, "4"});
  ProcessOptions options = interop_options(out);
  for (const auto& [layout, world] :
       std::vector<std::pair<std::string, int>>{{"dp2tp2", 4}, {"tp2", 2}, {"single", 1}}) {
    SCOPED_TRACE(layout);
    options.env["LAYOUT"] = layout;
    expect_all_ok(run_ranks_as_processes("tp_interop_load", world, options));
  }
}

TEST(TensorParallelInterop, PyTorchLoadsTdistsDp2Tp2Checkpoint) {
  if (!pytorch_unavailable().empty()) GTEST_SKIP() << pytorch_unavailable();
  const std::string out = make_temp_dir("tp-interop");
  expect_all_ok(run_ranks_as_processes("tp_interop_save", 4, interop_options(out)));
  run_oracle_script(TP_DCP_ORACLE_PY, {"load", interop_model(), out, "4"});
}

}  // namespace

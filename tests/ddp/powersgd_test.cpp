// The PowerSGD communication hook: its outputs against PyTorch's powerSGD_hook fed the same
// buckets (the .venv's PyTorch as the oracle, tests/ddp/python/powersgd_oracle.py), and DDP
// training with it end to end.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "ddp/training_helpers.h"
#include "support/expect.h"
#include "support/ranks.h"
#include "tdist/checkpoint/interchange.h"
#include "tdist/comm/distributed.h"
#include "tdist/ddp/distributed_data_parallel.h"
#include "tdist/ddp/powersgd_hook.h"

namespace {

using namespace tdist::testing;
namespace ddp = tdist::ddp;
namespace fs = std::filesystem;

// Two buckets, as DDP builds them (last layer first): repeated shapes (batched when asked),
// biases and small matrices left uncompressed, a 3-D tensor viewed as 5 x 12.
constexpr const char* kSpec = "3x16,3,16x16,16,16x16,16;16x12,16,5x4x3,7,2x2";
constexpr int kIters = 6;

std::vector<std::vector<std::vector<int64_t>>> parse_spec(const std::string& spec) {
  std::vector<std::vector<std::vector<int64_t>>> buckets(1);
  std::vector<int64_t> shape;
  std::string number;
  auto end_dim = [&] {
    shape.push_back(std::stoll(number));
    number.clear();
  };
  auto end_tensor = [&] {
    end_dim();
    buckets.back().push_back(shape);
    shape.clear();
  };
  for (char c : spec) {
    if (c == 'x') {
      end_dim();
    } else if (c == ',') {
      end_tensor();
    } else if (c == ';') {
      end_tensor();
      buckets.emplace_back();
    } else {
      number += c;
    }
  }
  end_tensor();
  return buckets;
}

std::vector<at::Tensor> views_of(const at::Tensor& buffer,
                                 const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<at::Tensor> views;
  int64_t offset = 0;
  for (const auto& shape : shapes) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    views.push_back(buffer.narrow(0, offset, numel).view(shape));
    offset += numel;
  }
  return views;
}

ddp::PowerSGDOptions options_from_env() {
  return ddp::PowerSGDOptions()
      .matrix_approximation_rank(std::stoll(env_or("PSGD_RANK", "1")))
      .start_powerSGD_iter(std::stoll(env_or("PSGD_START", "2")))
      .use_error_feedback(env_or("PSGD_EF", "1") == "1")
      .warm_start(env_or("PSGD_WARM", "1") == "1")
      .batch_tensors_with_same_shape(env_or("PSGD_BATCH", "0") == "1")
      .orthogonalization_epsilon(std::stod(env_or("PSGD_EPS", "0")))
      .random_seed(static_cast<uint32_t>(std::stoul(env_or("PSGD_SEED", "0"))))
      .min_compression_rate(std::stod(env_or("PSGD_MIN_RATE", "2")));
}

/// Feeds the oracle's inputs through tdist's hook as DDP does (every bucket of an iteration
/// launched, then waited in order) and compares each output with PyTorch's.
TDIST_SCENARIO(powersgd_parity) {
  tdist::init_process_group();
  const int rank = tdist::get_rank();
  const auto expected = tdist::checkpoint::load_safetensors(env_or("PSGD_DIR", "") + "/rank" +
                                                            std::to_string(rank) + ".safetensors");
  const auto buckets = parse_spec(kSpec);
  ddp::PowerSGDState state(options_from_env());
  for (int it = 0; it < kIters; ++it) {
    std::vector<ddp::CommHookFuture> futures;
    std::vector<std::string> names;
    for (size_t b = 0; b < buckets.size(); ++b) {
      const std::string suffix = std::to_string(it) + "." + std::to_string(b);
      at::Tensor buffer = expected.at("in." + suffix).clone();
      ddp::GradBucket bucket(b, b + 1 == buckets.size(), buffer, views_of(buffer, buckets[b]), {},
                             tdist::group_world());
      futures.push_back(ddp::powerSGD_hook(state, bucket));
      names.push_back("out." + suffix);
    }
    for (size_t b = 0; b < futures.size(); ++b) {
      at::Tensor got = futures[b].wait();
      const at::Tensor& want = expected.at(names[b]);
      const double err = (got - want).abs().max().item<double>();
      EXPECT_LE(err, 1e-5 * (1 + want.abs().max().item<double>()))
          << "rank " << rank << " " << names[b] << " (start "
          << state.options().start_powerSGD_iter() << ")";
    }
  }
  const at::Tensor stats = expected.at("stats");
  const auto ours = state.compression_stats();
  EXPECT_EQ(ours.numel_before_compression, stats[0].item<int64_t>());
  EXPECT_EQ(ours.numel_after_compression, stats[1].item<int64_t>());
  EXPECT_EQ(state.iter(), stats[2].item<int64_t>());
  EXPECT_GT(ours.compress_rate, 1.0);
  tdist::destroy_process_group();
}

struct OracleCase {
  std::string name;
  int world;
  std::map<std::string, std::string> env;
};

void PrintTo(const OracleCase& c, std::ostream* os) {
  *os << c.name << " at world " << c.world;
}

std::string make_temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "tdist_powersgd_XXXXXX").string();
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern;
}

class PowerSGDMatchesPyTorch : public ::testing::TestWithParam<OracleCase> {};

TEST_P(PowerSGDMatchesPyTorch, HookOutputsEqualPyTorchs) {
  OracleCase c = GetParam();
  const std::string dir = make_temp_dir();
  auto get = [&](const char* key, const char* fallback) {
    return c.env.count(key) ? c.env.at(key) : std::string(fallback);
  };
  std::ostringstream command;
  command << test_python() << " " << POWERSGD_ORACLE_PY << " " << dir << " " << c.world << " '"
          << kSpec << "' " << kIters << " " << get("PSGD_RANK", "1") << " "
          << get("PSGD_START", "2") << " " << get("PSGD_EF", "1") << " " << get("PSGD_WARM", "1")
          << " " << get("PSGD_BATCH", "0") << " " << get("PSGD_EPS", "0") << " "
          << get("PSGD_SEED", "0") << " " << get("PSGD_MIN_RATE", "2") << " > " << dir
          << "/oracle.log 2>&1";
  ASSERT_EQ(std::system(command.str().c_str()), 0)
      << "the oracle failed; see " << dir << "/oracle.log";
  ProcessOptions options;
  options.env = c.env;
  options.env["PSGD_DIR"] = dir;
  options.timeout = std::chrono::seconds(90);
  expect_all_ok(run_ranks_as_processes("powersgd_parity", c.world, options));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, PowerSGDMatchesPyTorch,
    ::testing::Values(
        // Rank 1, error feedback and warm start (PyTorch's recommended setting).
        OracleCase{"rank1_feedback_warm", 2, {}},
        // Rank 3 takes QR; no warm start (a fresh random Q per step), batched shapes, epsilon.
        OracleCase{"rank3_qr_cold_batched",
                   3,
                   {{"PSGD_RANK", "3"},
                    {"PSGD_START", "3"},
                    {"PSGD_WARM", "0"},
                    {"PSGD_BATCH", "1"},
                    {"PSGD_EPS", "1e-8"},
                    {"PSGD_SEED", "7"}}},
        // One rank, rank 2 (Gram-Schmidt), no error feedback.
        OracleCase{
            "rank2_no_feedback",
            1,
            {{"PSGD_RANK", "2"}, {"PSGD_EF", "0"}, {"PSGD_BATCH", "1"}, {"PSGD_SEED", "12345"}}},
        // Four ranks, everything compressible compressed (min rate 1).
        OracleCase{"rank1_min_rate_1", 4, {{"PSGD_MIN_RATE", "1"}, {"PSGD_START", "4"}}}),
    [](const auto& info) { return info.param.name + "_world" + std::to_string(info.param.world); });

std::vector<at::Tensor> gradients_of(Mlp& model) {
  std::vector<at::Tensor> gradients;
  for (const auto& p : model->parameters()) gradients.push_back(p.grad());
  return gradients;
}

/// DDP with the hook: before start_powerSGD_iter it is DDP's plain averaging (bitwise), after
/// it ranks stay identical and the loss still falls.
TDIST_SCENARIO(powersgd_ddp_training) {
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  constexpr int kSteps = 30;
  constexpr int kStart = 10;
  const auto data = make_batches(std::vector<int>(world, kSteps));
  Mlp plain_model = make_mlp(rank);
  Mlp compressed_model = make_mlp(rank);
  ddp::DistributedDataParallel plain(plain_model);
  ddp::DistributedDataParallel compressed(compressed_model);
  auto state = std::make_shared<ddp::PowerSGDState>(
      ddp::PowerSGDOptions().start_powerSGD_iter(kStart).min_compression_rate(1.0));
  compressed.register_comm_hook(state, ddp::powerSGD_hook);
  torch::optim::SGD plain_opt(plain_model->parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD compressed_opt(compressed_model->parameters(), torch::optim::SGDOptions(0.05));

  double first_loss = 0, last_loss = 0;
  for (int s = 0; s < kSteps; ++s) {
    for (auto* opt : {&plain_opt, &compressed_opt}) opt->zero_grad();
    loss_of(plain, data.of_rank[rank][s]).backward();
    at::Tensor loss = loss_of(compressed, data.of_rank[rank][s]);
    loss.backward();
    if (s < kStart) {
      EXPECT_EQ(max_abs_diff(gradients_of(plain_model), gradients_of(compressed_model)), 0.0)
          << "step " << s << ": before start_powerSGD_iter the hook must average as DDP does";
    }
    plain_opt.step();
    compressed_opt.step();
    // The mean loss over the ranks' fixed first batch tracks progress.
    at::Tensor probe = loss_of(compressed_model, data.of_rank[0][0]).detach();
    if (s == 0) first_loss = probe.item<double>();
    last_loss = probe.item<double>();
  }
  EXPECT_EQ(state->iter(), kSteps);
  EXPECT_GT(state->compression_stats().compress_rate, 1.0);
  EXPECT_EQ(max_diff_across_ranks(compressed_model->parameters()), 0.0);
  EXPECT_GT(max_abs_diff(plain_model->parameters(), compressed_model->parameters()), 0.0)
      << "compression never changed a gradient";
  EXPECT_LT(last_loss, first_loss);
  tdist::destroy_process_group();
}

TEST(PowerSGD, DdpTrainingWithTheHook) {
  for (int world : {2, 3}) {
    ProcessOptions options;
    options.timeout = std::chrono::seconds(90);
    expect_all_ok(run_ranks_as_processes("powersgd_ddp_training", world, options));
  }
}

TEST(PowerSGD, BadSettingsAreNamed) {
  expect_invalid_argument(
      [] { ddp::PowerSGDState state(ddp::PowerSGDOptions().start_powerSGD_iter(1)); },
      "start_powerSGD_iter must be > 1");
  // Without error feedback and warm start, compression may start at once.
  ddp::PowerSGDState immediate(
      ddp::PowerSGDOptions().start_powerSGD_iter(0).use_error_feedback(false).warm_start(false));
  EXPECT_EQ(immediate.iter(), 0);
  expect_invalid_argument(
      [] { ddp::PowerSGDState state(ddp::PowerSGDOptions().matrix_approximation_rank(0)); },
      "matrix_approximation_rank");
  expect_invalid_argument(
      [] { ddp::PowerSGDState state(ddp::PowerSGDOptions().min_compression_rate(0)); },
      "min_compression_rate");
}

}  // namespace

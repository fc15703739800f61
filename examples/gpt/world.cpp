#include "gpt/world.h"

#include <chrono>
#include <cstdlib>
#include <string>

#include <torch/torch.h>

#include "gpt/device.h"
#include "gpt/launcher.h"
#include "tdist/error.h"
#ifdef TDIST_GPT_WITH_COMM
#include "tdist/comm/distributed.h"
#include "tdist/store/hash_store.h"
#endif

namespace gpt {
namespace {

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  try {
    size_t used = 0;
    int parsed = std::stoi(value, &used);
    if (used == std::string(value).size()) return parsed;
  } catch (const std::exception&) {
  }
  TDIST_THROW(tdist::InvalidArgument, std::string("environment variable ") + name + "='" + value +
                                          "' is not an integer; unset it or launch with tdistrun");
}

#ifdef TDIST_GPT_WITH_COMM
// The backends for the rank's device, bound to its GPU on CUDA.
tdist::InitProcessGroupOptions group_options(const World& world) {
  auto options = tdist::InitProcessGroupOptions().backend(
      backend_for(world.device, tdist::is_nccl_available()));
  if (world.device.is_cuda()) options.device_id(world.device.str());
  return options;
}
#endif

}  // namespace

World init_world(int timeout_s, const std::string& device) {
  adopt_launch_environment();
  World world;
  world.world_size = env_int("WORLD_SIZE", 1);
  world.rank = env_int("RANK", 0);
  world.local_rank = env_int("LOCAL_RANK", world.rank);
  world.local_world_size = env_int("LOCAL_WORLD_SIZE", world.world_size);
  TDIST_CHECK_ARG(world.world_size >= 1,
                  "WORLD_SIZE must be >= 1, got " + std::to_string(world.world_size));
  TDIST_CHECK_ARG(world.rank >= 0 && world.rank < world.world_size,
                  "RANK=" + std::to_string(world.rank) +
                      " is outside [0, WORLD_SIZE=" + std::to_string(world.world_size) + ")");
  world.device = resolve_device(device, world.local_rank, world.local_world_size);
  if (!world.distributed()) return world;
#ifdef TDIST_GPT_WITH_COMM
  tdist::init_process_group(group_options(world)
                                .init_method("env://")
                                .rank(world.rank)
                                .world_size(world.world_size)
                                .timeout(std::chrono::seconds(timeout_s)));
#else
  (void)timeout_s;
  TDIST_THROW(tdist::InvalidArgument,
              "WORLD_SIZE=" + std::to_string(world.world_size) +
                  " but this gpt was built without tdist::comm; rebuild with the comm area or run "
                  "with --nproc 1");
#endif
  return world;
}

void ensure_process_group(const World& world) {
#ifdef TDIST_GPT_WITH_COMM
  if (tdist::is_initialized()) return;
  TDIST_CHECK_ARG(!world.distributed(),
                  "ensure_process_group: WORLD_SIZE=" + std::to_string(world.world_size) +
                      " but init_world joined no process group");
  tdist::init_process_group(
      group_options(world).store(std::make_shared<tdist::HashStore>()).rank(0).world_size(1));
#else
  (void)world;
#endif
}

void shutdown_world(const World& world) {
  (void)world;
#ifdef TDIST_GPT_WITH_COMM
  if (tdist::is_initialized()) tdist::destroy_process_group();
#endif
}

std::vector<double> all_mean(const World& world, const std::vector<double>& values) {
  if (!world.distributed() || values.empty()) return values;
#ifdef TDIST_GPT_WITH_COMM
  auto t = torch::tensor(values, torch::kDouble);
  tdist::all_reduce(t, tdist::ReduceOp::SUM);
  t.div_(static_cast<double>(world.world_size));
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
#else
  return values;
#endif
}

std::vector<double> all_gather_values(const World& world, double value) {
  if (!world.distributed()) return {value};
#ifdef TDIST_GPT_WITH_COMM
  auto in = torch::tensor({value}, torch::kDouble);
  auto out = torch::empty({world.world_size}, torch::kDouble);
  tdist::all_gather_into_tensor(out, in);
  return std::vector<double>(out.data_ptr<double>(), out.data_ptr<double>() + out.numel());
#else
  return {value};
#endif
}

void barrier(const World& world) {
#ifdef TDIST_GPT_WITH_COMM
  if (world.distributed()) tdist::barrier();
#else
  (void)world;
#endif
}

}  // namespace gpt

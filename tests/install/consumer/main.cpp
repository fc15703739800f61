// A program outside the tdist tree: one rank, an in-memory store, one all_reduce, one
// FSDP step of a layer built on the meta device, and a checkpoint round trip of that layer,
// all through the one include that promises the whole public API.
#include <filesystem>
#include <iostream>
#include <string>

#include <unistd.h>

#include <tdist/tdist.h>
#include <torch/torch.h>

// Saves the layer, overwrites its weight, loads it back: true when the weight is restored.
bool checkpoint_round_trip(torch::nn::Linear& layer) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("tdist-consumer-" + std::to_string(::getpid()));
  const auto saved = layer->weight.detach().clone();
  tdist::checkpoint::save_module(*layer, nullptr, {}, dir.string(),
                                 tdist::checkpoint::SaveOptions().fsync(false));
  {
    torch::NoGradGuard no_grad;
    layer->weight.fill_(0);
  }
  tdist::checkpoint::load_module(*layer, nullptr, dir.string());
  std::filesystem::remove_all(dir);
  return layer->weight.equal(saved);
}

int main() {
  tdist::init_process_group(tdist::InitProcessGroupOptions()
                                .backend("gloo")
                                .store(std::make_shared<tdist::HashStore>())
                                .rank(0)
                                .world_size(1));
  auto t = torch::arange(4, torch::kFloat);
  tdist::all_reduce(t);
  // FSDP with deferred init through the installed headers and libraries.
  torch::nn::Linear layer{nullptr};
  {
    tdist::fsdp::MetaDeviceGuard meta;
    layer = torch::nn::Linear(8, 4);
  }
  tdist::fsdp::fully_shard(layer);
  tdist::fsdp::materialize(layer, tdist::fsdp::MaterializeOptions().seed(7));
  auto loss = tdist::fsdp::forward(layer, torch::ones({2, 8})).sum();
  loss.backward();
  const bool trained = layer->weight.grad().defined() && !layer->weight.is_meta();
  const bool round_trip = checkpoint_round_trip(layer);
  tdist::destroy_process_group();
  if (!t.equal(torch::arange(4, torch::kFloat))) {
    std::cerr << "all_reduce at world size 1 changed the tensor\n";
    return 1;
  }
  if (!trained) {
    std::cerr << "the deferred-init FSDP layer got no gradient\n";
    return 1;
  }
  if (!round_trip) {
    std::cerr << "save_module then load_module did not restore the layer's weight\n";
    return 1;
  }
  std::cout << "consumer OK: " << t << "\n";
  return 0;
}

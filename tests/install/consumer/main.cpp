// A program outside the tdist tree: one rank, an in-memory store, one all_reduce, and one
// FSDP step of a layer built on the meta device.
#include <iostream>

#include <tdist/tdist.h>
#include <torch/torch.h>

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
  tdist::destroy_process_group();
  if (!t.equal(torch::arange(4, torch::kFloat))) {
    std::cerr << "all_reduce at world size 1 changed the tensor\n";
    return 1;
  }
  if (!trained) {
    std::cerr << "the deferred-init FSDP layer got no gradient\n";
    return 1;
  }
  std::cout << "consumer OK: " << t << "\n";
  return 0;
}

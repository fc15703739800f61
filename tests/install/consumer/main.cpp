// A program outside the tdist tree: one rank, an in-memory store, one all_reduce.
#include <iostream>

#include <torch/torch.h>
#include <tdist/tdist.h>

int main() {
  tdist::init_process_group(tdist::InitProcessGroupOptions()
                                .backend("gloo")
                                .store(std::make_shared<tdist::HashStore>())
                                .rank(0)
                                .world_size(1));
  auto t = torch::arange(4, torch::kFloat);
  tdist::all_reduce(t);
  tdist::destroy_process_group();
  if (!t.equal(torch::arange(4, torch::kFloat))) {
    std::cerr << "all_reduce at world size 1 changed the tensor\n";
    return 1;
  }
  std::cout << "consumer OK: " << t << "\n";
  return 0;
}

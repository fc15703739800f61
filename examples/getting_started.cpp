// Getting started: every process runs this program; tdistrun (or any launcher) sets
// MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.
//   tdistrun --nproc-per-node 2 ./getting_started
#include <iostream>

#include <torch/torch.h>

#include "tdist/comm/distributed.h"

int main() {
  tdist::init_process_group();  // env://, gloo for CPU tensors
  const int rank = tdist::get_rank();
  const int world_size = tdist::get_world_size();

  at::Tensor t = torch::full({4}, static_cast<float>(rank + 1));
  tdist::all_reduce(t, tdist::ReduceOp::SUM);  // every rank now holds 1 + 2 + ... + world_size

  std::cout << "rank " << rank << "/" << world_size << ": " << t << std::endl;
  tdist::destroy_process_group();
  return 0;
}

// Getting started: every process runs this program (SPMD); tdistrun (or any launcher) sets
// MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.
//   tdistrun --standalone --nproc-per-node 2 ./getting_started
#include <iostream>

#include <torch/torch.h>

#include <tdist/tdist.h>

int main() {
  tdist::init_process_group();  // env://, gloo for CPU tensors
  const int rank = tdist::get_rank();
  const int world_size = tdist::get_world_size();

  auto t = torch::full({4}, static_cast<float>(rank + 1));
  tdist::all_reduce(t, tdist::ReduceOp::SUM);  // every rank: 1 + 2 + ... + world_size

  auto gathered = torch::empty({4 * world_size});
  tdist::all_gather_into_tensor(gathered, t);  // world_size copies, one per rank

  std::cout << "rank " << rank << "/" << world_size << ": sum " << t[0].item<float>()
            << ", gathered " << gathered.numel() << " values" << std::endl;
  tdist::destroy_process_group();
  return 0;
}

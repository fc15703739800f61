// Tensor-parallel training steps of a Llama folder (tdist::models::apply_tensor_parallel over
// every rank: torchtitan's plan, "plain" with replicated logits or "sp" with sequence and loss
// parallelism), timed per step, with the bytes each rank sent in one step counted from the
// flight recorder's records and set beside the plan's formula. Run with tdistrun
// (bench/tensor/run.sh); rank 0 prints one JSON line:
//   tdistrun --standalone --nproc-per-node 4 bench_tensor_parallel DIR BATCH SEQ STEPS WARMUP MODE

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tdist/comm/distributed.h"
#include "tdist/comm/flight_recorder.h"
#include "tdist/mesh/device_mesh.h"
#include "tdist/models/causal_lm.h"
#include "tdist/models/pretrained.h"
#include "tdist/models/tensor_parallel.h"

namespace {

// Bytes this rank sends in a ring algorithm for one recorded collective of its group.
double ring_bytes(const tdist::CollectiveRecord& r) {
  const double k = static_cast<double>(r.group_ranks.size());
  if (k <= 1 || r.shapes.empty()) return 0;
  double elements = 1;
  for (int64_t s : r.shapes.front()) elements *= static_cast<double>(s);
  const double bytes = elements * 4;  // float32 (checked by the caller)
  // The recorder keeps this rank's part of an all-gather (its input) and of a reduce-scatter
  // (its output), the whole tensor of the others.
  if (r.op == "all_reduce") return 2 * (k - 1) / k * bytes;
  if (r.op == "all_gather_into_tensor" || r.op == "reduce_scatter_tensor") return (k - 1) * bytes;
  if (r.op == "all_to_all_single") return (k - 1) / k * bytes;
  return bytes;  // anything else would be unexpected in a step; counted whole
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7 || (std::string(argv[6]) != "plain" && std::string(argv[6]) != "sp")) {
    std::fprintf(stderr, "usage: %s DIR BATCH SEQ STEPS WARMUP plain|sp\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t batch = std::stoll(argv[2]), seq = std::stoll(argv[3]);
  const int steps = std::stoi(argv[4]), warmup = std::stoi(argv[5]);
  const bool sp = std::string(argv[6]) == "sp";
  torch::set_num_threads(1);
  tdist::init_process_group();
  const int rank = tdist::get_rank(), world = tdist::get_world_size();
  auto mesh = tdist::mesh::init_device_mesh("cpu", {world});
  auto model = tdist::models::from_pretrained(dir);
  model->train();
  tdist::models::apply_tensor_parallel(
      model, mesh, tdist::models::TensorParallelOptions().sequence_parallel(sp).loss_parallel(sp));
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
  const auto& c = model->config();
  torch::manual_seed(7);
  const torch::Tensor ids = torch::randint(0, c.vocab_size, {batch, seq});
  // transformers' labels=ids: the token after each position; the last has none.
  const torch::Tensor targets = tdist::models::next_token_targets(ids);

  std::vector<double> step_ms;
  double sent = 0;
  bool float32 = true;
  double loss = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    tdist::barrier();
    const auto records_before = tdist::flight_recorder_records();
    const uint64_t last_id = records_before.empty() ? 0 : records_before.back().id;
    const auto start = std::chrono::steady_clock::now();
    const torch::Tensor l = model->next_token_loss(ids, targets);
    l.backward();
    optimizer.step();
    optimizer.zero_grad();
    step_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    loss = l.item<double>();
    if (step == warmup) {  // one step's traffic (the records kept cover it: see capacity)
      for (const auto& r : tdist::flight_recorder_records()) {
        if (r.id <= last_id || r.op == "barrier") continue;
        for (const auto& d : r.dtypes) float32 = float32 && d == "Float";
        sent += ring_bytes(r);
        if (std::getenv("BENCH_TP_VERBOSE") && rank == 0) {
          std::fprintf(stderr, "%s %s %s\n", r.op.c_str(), c10::str(r.shapes).c_str(),
                       r.label.c_str());
        }
      }
    }
  }
  std::vector<double> timed(step_ms.begin() + warmup, step_ms.end());
  std::sort(timed.begin(), timed.end());
  const double k = world, n = static_cast<double>(batch * seq);
  const double h = static_cast<double>(c.hidden_size), v = static_cast<double>(c.vocab_size);
  const double layers = static_cast<double>(c.num_hidden_layers);
  // The plan's traffic (docs/tensor_parallel.md, "Benchmark"), in units of (k - 1) / k * 4
  // bytes. plain: all-reduces of [N, H] activations (the embedding's and 2 per layer
  // forward; q, k, v, gate, up's input gradients and the head's backward), and the
  // all-gather of the [N, V] logits. sp: per layer 4 all-gathers and 4 reduce-scatters of
  // [N, H] (attention's and the MLP's input gathered once, their outputs reduce-scattered,
  // and the reverse in backward), the embedding's and the head's 2 each; all-reduces of the
  // norms' [H] weight gradients (2 per layer and the final one) and loss_parallel's 3 of [N].
  const double unit = (k - 1) / k * 4;
  const double formula =
      sp ? unit * ((8 * layers + 4) * n * h + 2 * (2 * layers + 1) * h + 2 * 3 * n)
         : unit * ((7 * layers + 2) * 2 * n * h + n * v);
  if (rank == 0) {
    std::printf(
        "{\"impl\": \"tdist\", \"mode\": \"%s\", \"world\": %d, \"step_ms_median\": %.3f, "
        "\"step_ms_min\": %.3f, "
        "\"step_ms_max\": %.3f, \"loss\": %.6f, \"bytes_sent\": %.0f, \"bytes_formula\": %.0f, "
        "\"float32\": %s}\n",
        sp ? "sp" : "plain", world, timed[timed.size() / 2], timed.front(), timed.back(), loss,
        sent, formula, float32 ? "true" : "false");
  }
  tdist::destroy_process_group();
  return 0;
}

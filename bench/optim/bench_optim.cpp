// One optimizer step, timed: tdist::optim's for-loop, foreach and fused implementations and
// LibTorch's torch::optim, on the parameter shapes of shapes.txt (the C++ half of run.sh;
// optim_torch.py is torch.optim's). Parameters and gradients come from a seeded generator,
// as on the Python side, so both sides step the same numbers: each row prints a checksum of
// the parameters after its steps (their dot product with the gradients).
//   bench_optim SHAPES [--optimizer adamw|adam|sgd] [--device cpu|cuda] [--steps N]
//               [--rounds R] [--threads T]
// Prints one JSON line per implementation: {"impl", "optimizer", "ms" (median round's
// time per step), "checksum"}.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "tdist/optim/adam.h"
#include "tdist/optim/sgd.h"

namespace {

namespace optim = tdist::optim;

struct Args {
  std::string shapes, optimizer = "adamw", device = "cpu";
  int steps = 10, rounds = 5, threads = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  a.shapes = argc > 1 ? argv[1] : "";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--optimizer") a.optimizer = v;
    if (k == "--device") a.device = v;
    if (k == "--steps") a.steps = std::stoi(v);
    if (k == "--rounds") a.rounds = std::stoi(v);
    if (k == "--threads") a.threads = std::stoi(v);
  }
  return a;
}

std::vector<std::vector<int64_t>> read_shapes(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<int64_t>> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::vector<int64_t> shape;
    for (int64_t d; s >> d;) shape.push_back(d);
    out.push_back(shape);
  }
  return out;
}

std::unique_ptr<torch::optim::Optimizer> make(const Args& a, const std::string& impl,
                                              const std::vector<at::Tensor>& params) {
  if (impl == "libtorch") {
    if (a.optimizer == "adam") {
      return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
    }
    if (a.optimizer == "sgd") {
      return std::make_unique<torch::optim::SGD>(params,
                                                 torch::optim::SGDOptions(1e-2).momentum(0.9));
    }
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3));
  }
  const auto which = optim::implementation_from_string(impl);
  if (a.optimizer == "adam") {
    return std::make_unique<optim::Adam>(params, optim::AdamOptions(1e-3).implementation(which));
  }
  if (a.optimizer == "sgd") {
    return std::make_unique<optim::SGD>(
        params, optim::SGDOptions(1e-2).momentum(0.9).implementation(which));
  }
  return std::make_unique<optim::AdamW>(params, optim::AdamWOptions(1e-3).implementation(which));
}

void sync(const Args& a) {
  if (a.device == "cuda") torch::cuda::synchronize();
}

void run(const Args& a, const std::string& impl) {
  const at::Device device(a.device);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  std::vector<at::Tensor> params;
  for (const auto& shape : read_shapes(a.shapes)) {
    auto p = at::randn(shape, gen).to(device);
    p.mutable_grad() = (at::randn(shape, gen) * 1e-2).to(device);
    params.push_back(p);
  }
  auto opt = make(a, impl, params);
  opt->step();  // warm-up: creates the state
  sync(a);
  std::vector<double> ms;
  for (int r = 0; r < a.rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < a.steps; ++s) opt->step();
    sync(a);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count() /
                 a.steps);
  }
  std::sort(ms.begin(), ms.end());
  double checksum = 0;
  // Against the (fixed) gradients: every step moves this sum by about lr x sum|g|, so a
  // wrong update shows, while rounding differences between implementations stay ~1e-9.
  for (const auto& p : params) {
    checksum += (p.to(at::kDouble) * p.grad().to(at::kDouble)).sum().item<double>();
  }
  std::printf("{\"impl\": \"%s\", \"optimizer\": \"%s\", \"ms\": %.4f, \"checksum\": %.10g}\n",
              impl.c_str(), a.optimizer.c_str(), ms[ms.size() / 2], checksum);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.shapes.empty()) {
    std::fprintf(stderr, "usage: bench_optim SHAPES [--optimizer adamw|adam|sgd] ...\n");
    return 2;
  }
  at::set_num_threads(a.threads);
  for (const char* impl : {"for-loop", "foreach", "fused", "libtorch"}) run(a, impl);
  return 0;
}

// Loading a model folder into FSDP shards (tdist::models::from_pretrained with fully_shard),
// each rank timed and its peak memory taken, beside the time one process takes to read the
// same files once. Run with tdistrun (bench/models/run.sh --load DIR):
//   tdistrun --standalone --nproc-per-node 2 bench_model_load DIR
// Peak memory is judged against what a rank must hold: its shards plus the largest module's
// own rows (Note [Loading into shards]); rank 0 prints the table.

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tdist/comm/distributed.h"
#include "tdist/comm/object_collectives.h"
#include "tdist/fsdp/deferred_init.h"
#include "tdist/models/pretrained.h"

namespace {

double gib(double bytes) {
  return bytes / (1024.0 * 1024.0 * 1024.0);
}

double status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stod(line.substr(line.find(':') + 1));
  }
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Reads every file of the folder once, as a baseline; returns the seconds taken.
double read_folder_once(const std::string& dir, double* bytes) {
  std::vector<char> buffer(64 << 20);
  const auto start = std::chrono::steady_clock::now();
  *bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY);
    ssize_t n;
    while ((n = ::read(fd, buffer.data(), buffer.size())) > 0) *bytes += static_cast<double>(n);
    ::close(fd);
  }
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tdistrun --nproc-per-node 2 bench_model_load DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  tdist::init_process_group(tdist::InitProcessGroupOptions().backend("gloo"));
  const int rank = tdist::get_rank();
  double file_bytes = 0, read_s = 0;
  if (rank == 0) {
    read_folder_once(dir, &file_bytes);  // the page cache holds the files for both sides
    read_s = read_folder_once(dir, &file_bytes);
  }
  tdist::barrier();
  const double rss_before = status_kib("VmRSS") * 1024;
  const auto start = std::chrono::steady_clock::now();
  auto model = tdist::models::from_pretrained(dir, tdist::models::LoadOptions().fully_shard(true));
  const double load_s = seconds_since(start);
  const double peak = status_kib("VmHWM") * 1024 - rss_before;
  double shard_bytes = 0, largest_module = 0;
  for (const auto& p : model->parameters()) shard_bytes += static_cast<double>(p.nbytes());
  for (const auto& item : model->named_modules()) {
    double own = 0;
    for (const auto& p : item.value()->parameters(/*recurse=*/false)) {
      own += static_cast<double>(p.nbytes());
    }
    largest_module = std::max(largest_module, own);
  }
  tdist::barrier();
  const double all_s = seconds_since(start);
  // What FSDP's own allocation of the same shards costs, reading nothing: the same model built
  // on the meta device, sharded and materialized with zeros.
  const tdist::models::ModelConfig config = model->config();
  model.reset();
  tdist::barrier();
  const auto alloc_start = std::chrono::steady_clock::now();
  {
    std::shared_ptr<tdist::models::CausalLM> empty;
    {
      tdist::fsdp::MetaDeviceGuard meta;
      empty = tdist::models::build_model(config);
      empty->to(config.dtype);
    }
    tdist::models::fully_shard_model(empty);
    tdist::fsdp::materialize(empty, tdist::fsdp::MaterializeOptions().init_fn(
                                        [](const std::string&, torch::nn::Module& m) {
                                          for (auto& p : m.parameters(false)) p.zero_();
                                        }));
    tdist::barrier();
  }
  const double alloc_s = seconds_since(alloc_start);
  std::vector<tdist::Object> rows;
  tdist::all_gather_object(
      rows, tdist::Object(tdist::Object::List{load_s, peak, shard_bytes, largest_module}));
  if (rank == 0) {
    std::printf(
        "model: %lld parameters, %.2f GiB of %s files; reading them once (warm cache): "
        "%.2f s\n",
        static_cast<long long>(config.num_parameters()), gib(file_bytes),
        c10::toString(config.dtype), read_s);
    std::printf("%-5s %8s %10s %14s %12s %22s %8s\n", "rank", "load s", "vs read", "peak GiB",
                "shards GiB", "shards+largest module", "ratio");
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto& v = rows[r].as_list();
      const double bound = v[2].as_double() + v[3].as_double();
      std::printf("%-5zu %8.2f %9.2fx %14.2f %12.2f %22.2f %7.2fx\n", r, v[0].as_double(),
                  v[0].as_double() / read_s, gib(v[1].as_double()), gib(v[2].as_double()),
                  gib(bound), v[1].as_double() / bound);
    }
    std::printf(
        "all ranks loaded in %.2f s = %.2fx reading the files once; FSDP allocating "
        "and zeroing the same shards, reading nothing: %.2f s\n",
        all_s, all_s / read_s, alloc_s);
  }
  tdist::destroy_process_group();
  return 0;
}

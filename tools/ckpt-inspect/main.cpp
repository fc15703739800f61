// ckpt-inspect: show what a checkpoint (tdist's, or PyTorch's distributed checkpoint) holds
// and whether it is intact.
//   ckpt-inspect <dir>            tensors, files, extra state; metadata + sizes checked
//   ckpt-inspect --verify <dir>   also reads every block and checks its CRC32C (a DCP
//                                 checkpoint: decodes every slice, checking its zip CRC)
//   ckpt-inspect --list <root>    the step directories of a CheckpointManager root
//   ckpt-inspect --export <dir> <pt|safetensors|dcp> <out> [prefix]
//                                 its tensors gathered whole into one file Python reads, or
//                                 into a torch.distributed.checkpoint directory (prefix, e.g.
//                                 "model.", selects and strips names)
// Exit status: 0 complete, 1 incomplete/corrupt/missing, 2 usage.

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "tdist/checkpoint/checkpoint.h"
#include "tdist/checkpoint/checkpoint_manager.h"
#include "tdist/checkpoint/interchange.h"

namespace ckpt = tdist::checkpoint;

namespace {

std::string shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int show(const std::string& dir, bool read_data) {
  const ckpt::VerifyReport report = ckpt::verify(dir, read_data);
  std::cout << dir << ": " << ckpt::to_string(report.status)
            << (read_data ? " (all blocks verified)" : " (metadata and sizes checked)") << "\n";
  if (!report.detail.empty()) std::cout << "  " << report.detail << "\n";
  if (report.status != ckpt::CheckpointStatus::kComplete) return 1;
  const ckpt::CheckpointMetadata m = ckpt::read_metadata(dir);
  std::cout << "format " << ckpt::to_string(m.format) << "; saved at world size " << m.world_size
            << "; " << m.tensors.size() << " tensors in " << m.files.size() << " files\n";
  for (const auto& [name, f] : m.files) {
    std::cout << "  " << name << "  rank " << f.rank << "  " << f.size << " bytes  "
              << f.block_crc32c.size() << " blocks of " << f.block_bytes << "\n";
  }
  for (const auto& [name, t] : m.tensors) {
    std::cout << "  " << name << "  " << t.dtype << " " << shape(t.global_shape) << "  "
              << t.chunks.size() << " chunk(s)\n";
  }
  if (!m.extra_per_rank.empty()) {
    std::cout << "extra state (rank 0): " << m.extra_per_rank[0].to_json().dump() << "\n";
  }
  return 0;
}

int export_to(const std::string& dir, const std::string& format, const std::string& out,
              const std::string& prefix) {
  if (format != "pt" && format != "safetensors" && format != "dcp") {
    std::cerr << "ckpt-inspect --export: format must be pt, safetensors or dcp, not '" << format
              << "'\n";
    return 2;
  }
  try {
    const ckpt::TensorMap tensors = ckpt::read_full_tensors(dir, prefix);
    if (tensors.empty()) {
      std::cerr << "ckpt-inspect --export: " << dir << " has no tensor named '" << prefix
                << "...'\n";
      return 1;
    }
    if (format == "pt") {
      ckpt::export_torch_file(tensors, out);
    } else if (format == "dcp") {
      tdist::ShardedStateDict whole;
      for (const auto& [name, t] : tensors) whole[name] = tdist::ShardedTensor::whole(t);
      const auto extras = ckpt::read_metadata(dir).extra_per_rank;
      ckpt::save(whole, extras.empty() ? ckpt::ExtraState{} : extras[0], out,
                 ckpt::SaveOptions()
                     .format(ckpt::CheckpointFormat::kDCP)
                     .coordinator(std::make_shared<ckpt::LocalCoordinator>()));
    } else {
      ckpt::save_safetensors(tensors, out);
    }
    std::cout << "wrote " << tensors.size() << " tensors to " << out << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ckpt-inspect --export: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--list") {
    ckpt::CheckpointManager manager(argv[2]);
    bool all_ok = true;
    for (const auto& e : manager.list()) {
      std::cout << e.step << "\t" << ckpt::to_string(e.status) << "\t" << e.path
                << (e.detail.empty() ? "" : "\t" + e.detail) << "\n";
      all_ok = all_ok && e.status == ckpt::CheckpointStatus::kComplete;
    }
    return all_ok ? 0 : 1;
  }
  if (argc == 3 && std::string(argv[1]) == "--verify") return show(argv[2], true);
  if ((argc == 5 || argc == 6) && std::string(argv[1]) == "--export") {
    return export_to(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : "");
  }
  if (argc == 2 && argv[1][0] != '-') return show(argv[1], false);
  std::cerr << "usage: ckpt-inspect [--verify] <checkpoint-dir> | --list <manager-root> | "
               "--export <checkpoint-dir> <pt|safetensors|dcp> <out> [prefix]\n";
  return 2;
}

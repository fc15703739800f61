#include "nccl/device_choice.h"

#include <cctype>

#include "tdist/error.h"

namespace tdist::nccl::detail {

namespace {

/// The non-negative integer `text` is, or -1.
int parse_index(const std::string& text) {
  if (text.empty() || text.size() > 6) return -1;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  }
  return std::stoi(text);
}

int from_device_id(const std::string& device_id) {
  const auto colon = device_id.find(':');
  const std::string type = device_id.substr(0, colon);
  if (type != "cuda") {
    TDIST_THROW(InvalidArgument, "nccl: device_id '" + device_id +
                                     "' is not a CUDA device; nccl runs on \"cuda:N\" devices");
  }
  if (colon == std::string::npos) return -1;
  const int index = parse_index(device_id.substr(colon + 1));
  if (index < 0) {
    TDIST_THROW(InvalidArgument,
                "nccl: device_id '" + device_id + "' is malformed; expected \"cuda:N\"");
  }
  return index;
}

}  // namespace

int choose_device_index(int requested, const std::string& device_id, const std::string& local_rank,
                        int rank, int device_count, bool visible_devices_set) {
  if (device_count <= 0) {
    TDIST_THROW(DistBackendError,
                "nccl: this process sees no CUDA GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES); "
                "nccl needs one per rank. On a machine without GPUs use backend \"gloo\"");
  }
  int index = requested;
  std::string source = "the requested device index";
  if (index < 0 && !device_id.empty()) {
    index = from_device_id(device_id);
    source = "device_id '" + device_id + "'";
  }
  if (index < 0 && !local_rank.empty()) {
    index = parse_index(local_rank);
    if (index < 0) {
      TDIST_THROW(InvalidArgument, "nccl: LOCAL_RANK='" + local_rank +
                                       "' is not a non-negative integer; unset it or fix "
                                       "the launcher");
    }
    source = "LOCAL_RANK=" + local_rank;
    // A scheduler that hands each process its own GPU (CUDA_VISIBLE_DEVICES per task) leaves
    // one visible whatever the local rank: that one is meant. Without CUDA_VISIBLE_DEVICES,
    // a second local rank on a one-GPU machine stays the error below.
    if (device_count == 1 && visible_devices_set) index = 0;
  }
  if (index < 0) {
    index = rank % device_count;
    source = "rank " + std::to_string(rank) + " modulo the GPU count";
  }
  if (index >= device_count) {
    TDIST_THROW(InvalidArgument,
                "nccl: " + source + " names cuda:" + std::to_string(index) +
                    " but this process sees " + std::to_string(device_count) +
                    " GPU(s); run at most one rank per GPU on each machine, or pass device_id");
  }
  return index;
}

}  // namespace tdist::nccl::detail

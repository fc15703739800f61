#include "gpt/device.h"

#include <torch/cuda.h>

#include "tdist/error.h"

namespace gpt {

c10::Device resolve_device(const std::string& requested, int local_rank, int local_world_size) {
  TDIST_CHECK_ARG(requested == "cpu" || requested == "cuda" || requested == "auto",
                  "--device must be cpu, cuda or auto, got '" + requested + "'");
  if (requested == "cpu") return c10::Device(c10::kCPU);
  const bool has_cuda = torch::cuda::is_available();
  const int gpus = has_cuda ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (requested == "auto") {
    return gpus > 0 && local_world_size <= gpus ? c10::Device(c10::kCUDA, local_rank)
                                                : c10::Device(c10::kCPU);
  }
  TDIST_CHECK_ARG(gpus > 0,
                  "--device cuda: this process sees no CUDA GPU (no driver, no device, or "
                  "CUDA_VISIBLE_DEVICES hides them all); use --device cpu, or --device auto to "
                  "take a GPU only when there is one");
  TDIST_CHECK_ARG(local_rank < gpus, "--device cuda: LOCAL_RANK=" + std::to_string(local_rank) +
                                         " but this node's processes see " + std::to_string(gpus) +
                                         " GPU(s); NCCL needs one GPU per rank: start at most " +
                                         std::to_string(gpus) + " rank(s) per node (--nproc " +
                                         std::to_string(gpus) + ") or use --device cpu");
  return c10::Device(c10::kCUDA, local_rank);
}

std::string backend_for(const c10::Device& device, bool nccl_available) {
  if (device.is_cuda() && nccl_available) return "cpu:gloo,cuda:nccl";
  return "gloo";
}

}  // namespace gpt

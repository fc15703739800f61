#include "nccl/nccl_work.h"

#include <ATen/cuda/CUDAContext.h>

namespace tdist::nccl::detail {

NCCLWork::NCCLWork(std::string op_name, std::vector<at::Tensor> outputs, c10::Device device,
                   Clock::time_point deadline, bool blocks_host)
    : Work(std::move(op_name), std::move(outputs)),
      device_(device),
      deadline_(deadline),
      blocks_host_(blocks_host) {}

bool NCCLWork::wait(std::chrono::milliseconds timeout) {
  if (auto error = exception()) std::rethrow_exception(error);
  end_.block(at::cuda::getCurrentCUDAStream(device_.index()));
  if (blocks_host_) return Work::wait(timeout);
  return true;
}

}  // namespace tdist::nccl::detail

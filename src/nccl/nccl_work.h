#pragma once

// The Work of one NCCL collective (c10d's WorkNCCL): an event recorded on the group's
// communication stream after the collective's kernels. wait() makes the caller's current
// stream wait on that event and returns at once (the host does not block), unless blocking
// wait is on or the op is a barrier; the watchdog completes the Work when the event has
// fired, or fails it (Note [Stream semantics] in docs/nccl.md).

#include <chrono>
#include <vector>

#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/Device.h>

#include "tdist/comm/work.h"

namespace tdist::nccl::detail {

class NCCLWork : public Work {
 public:
  using Clock = std::chrono::steady_clock;
  NCCLWork(std::string op_name, std::vector<at::Tensor> outputs, c10::Device device,
           Clock::time_point deadline, bool blocks_host);

  /// Orders the current stream after the collective; blocks the host only for barriers and
  /// under blocking wait. Rethrows the collective's error once the watchdog has one.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) override;

  /// Records the end event on the communication stream (once, right after the launch).
  void record_end(const c10::cuda::CUDAStream& stream) { end_.record(stream); }
  /// True when every kernel of the collective has finished on the device.
  bool device_done() { return end_.query(); }
  Clock::time_point deadline() const { return deadline_; }
  /// True when wait() blocks the host until the watchdog completes this Work.
  bool blocks_host() const { return blocks_host_; }
  const c10::Device& device() const { return device_; }

 private:
  at::cuda::CUDAEvent end_;
  c10::Device device_;
  Clock::time_point deadline_;
  bool blocks_host_;
};

}  // namespace tdist::nccl::detail

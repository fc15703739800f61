#pragma once

// DeviceStreams: the streams FSDP's collectives use on an accelerator, and the events that
// order them. On the CPU there are none (device_streams_for returns null and every
// StreamScope is empty): the caller's thread is the only "stream".
//
// Note [FSDP streams]
// As FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py), on CUDA:
//  - all-gather: the copy-in stream waits for the compute stream (the optimizer may just have
//    written the shards) once per forward, in the root's pre-forward, or for the event given to
//    FSDPModule::set_post_optim_event instead; an explicit FSDPModule::unshard, an all-gather
//    outside a root's forward and backward (Join's replay) and one of a post-forward slab (which
//    the compute stream wrote) waits itself. The copy-in (host-to-device and non-blocking for
//    pinned offloaded shards) runs on it and the all-gather is issued with it current, so the
//    collective (on the process group's own stream, Note [Stream semantics] in docs/nccl.md) waits
//    for the copy-in only, not for the compute queued since: a prefetched all-gather overlaps the
//    current module's compute. The copy-out runs on the compute stream after Work::wait
//    (stream-ordered, the host does not block); then the copy-in stream waits for the compute
//    stream, because the caching allocator hands a block freed by a stream to that stream's next
//    allocation: the next copy-in must not reuse the gathered buffer while the copy-out may still
//    read it.
//  - reduce-scatter: the gradients are copied in on the compute stream (which made them, and
//    whose later allocations may reuse their memory once the host drops them); the
//    reduce-scatter stream waits for it and the collective is issued with it current (a
//    group of one copies instead, and marks the input in use by that stream). The
//    reduction's completion, division, HSDP all-reduce and installation as sharded gradients
//    (device-to-host, non-blocking into pinned memory with CPU offload) run on the
//    reduce-scatter stream, so the compute stream never waits for a reduce-scatter during
//    backward; it joins the reduce-scatter stream at the end of backward (ParamGroup::
//    join_reduce_stream) and, with offload, the host waits for the last copy to the host
//    before optimizer.step() reads the gradients.
// No cudaDeviceSynchronize anywhere: only events between streams, and the one host wait.

#include <memory>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>

namespace tdist::fsdp::detail {

enum class StreamRole {
  kCompute,          // the stream current when FSDP was entered (the user's)
  kAllGatherCopyIn,  // copy-in of the all-gathers, issue of the all-gathers
  kReduceScatter,    // issue of the reduce-scatters, and what follows them
};

const char* to_string(StreamRole role);

class DeviceStreams {
 public:
  virtual ~DeviceStreams() = default;
  /// `waiter` waits, on the device (the host goes on), for the work queued on `producer` so
  /// far.
  virtual void wait(StreamRole waiter, StreamRole producer) = 0;
  /// `waiter` waits for `event` (recorded by the caller: FSDPModule::set_post_optim_event).
  virtual void wait_event(StreamRole waiter, const c10::Event& event) = 0;
  /// Makes `role`'s stream this thread's current stream, until the matching leave().
  virtual void enter(StreamRole role) = 0;
  virtual void leave() = 0;
  /// `tensor` (allocated on another stream) is used by work queued on `user`: the caching
  /// allocator keeps its memory from that stream's next owner until the work `user` has
  /// queued when the tensor is freed is done (c10's recordDataPtrOnStream, Tensor.record_stream).
  virtual void record_use(const at::Tensor& tensor, StreamRole user) = 0;
  /// Marks the work queued on the current stream so far as what host_wait() waits for.
  virtual void mark_host_fence() = 0;
  /// Blocks the host until the last marked work is done (nothing marked: returns at once).
  virtual void host_wait() = 0;
};

/// Enters `role` for its lifetime; empty when `streams` is null (the CPU).
class StreamScope {
 public:
  StreamScope(DeviceStreams* streams, StreamRole role) : streams_(streams) {
    if (streams_ != nullptr) streams_->enter(role);
  }
  ~StreamScope() {
    if (streams_ != nullptr) streams_->leave();
  }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  DeviceStreams* streams_;
};

/// FSDP's streams on `device` (one set per device in the process, shared by every FSDP
/// tree on it, streams from LibTorch's pool through c10's device-generic interface); null for
/// the CPU and the meta device.
DeviceStreams* device_streams_for(const c10::Device& device);

/// Tests: while alive, device_streams_for returns `streams` for every device, the CPU
/// included, so the stream bookkeeping of a CPU run can be recorded and checked.
class ScopedDeviceStreamsOverride {
 public:
  explicit ScopedDeviceStreamsOverride(std::shared_ptr<DeviceStreams> streams);
  ~ScopedDeviceStreamsOverride();
  ScopedDeviceStreamsOverride(const ScopedDeviceStreamsOverride&) = delete;
  ScopedDeviceStreamsOverride& operator=(const ScopedDeviceStreamsOverride&) = delete;
};

/// The streams of an accelerator `device` built on c10's DeviceGuardImplInterface (CUDA, or
/// any device type with a registered guard that has streams and events).
std::unique_ptr<DeviceStreams> make_c10_device_streams(const c10::Device& device);

}  // namespace tdist::fsdp::detail

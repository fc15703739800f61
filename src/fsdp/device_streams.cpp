#include "fsdp/device_streams.h"

#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace tdist::fsdp::detail {

const char* to_string(StreamRole role) {
  switch (role) {
    case StreamRole::kCompute:
      return "compute";
    case StreamRole::kAllGatherCopyIn:
      return "all_gather_copy_in";
    case StreamRole::kReduceScatter:
      return "reduce_scatter";
  }
  return "?";
}

namespace {

// The streams current before each enter() on this thread, innermost last. Backward hooks run
// on the autograd engine's thread of the device, forward on the caller's: each thread keeps
// its own stack (scopes nest, so one stack serves every device).
std::vector<c10::Stream>& entered_streams() {
  thread_local std::vector<c10::Stream> stack;
  return stack;
}

class C10DeviceStreams final : public DeviceStreams {
 public:
  explicit C10DeviceStreams(const c10::Device& device)
      : impl_(device.type()),
        device_(device.has_index() ? device : impl_.getDevice()),
        // FSDP2's priorities: the collectives' issue stream is high priority, the copy-in not.
        copy_in_(impl_.getStreamFromGlobalPool(device_, /*isHighPriority=*/false)),
        reduce_scatter_(impl_.getStreamFromGlobalPool(device_, /*isHighPriority=*/true)) {}

  void wait(StreamRole waiter, StreamRole producer) override {
    c10::Event event(device_.type());
    event.record(stream(producer));
    event.block(stream(waiter));
  }

  void wait_event(StreamRole waiter, const c10::Event& event) override {
    event.block(stream(waiter));
  }

  void enter(StreamRole role) override {
    const c10::Stream next = stream(role);
    entered_streams().push_back(impl_.exchangeStream(next));
  }

  void leave() override {
    std::vector<c10::Stream>& stack = entered_streams();
    impl_.exchangeStream(stack.back());
    stack.pop_back();
  }

  void record_use(const at::Tensor& tensor, StreamRole user) override {
    if (tensor.has_storage() && tensor.storage().nbytes() > 0) {
      impl_.recordDataPtrOnStream(tensor.storage().data_ptr(), stream(user));
    }
  }

  void mark_host_fence() override {
    std::lock_guard<std::mutex> lock(fence_mutex_);
    fence_.emplace(device_.type());
    fence_->record(impl_.getStream(device_));
  }

  void host_wait() override {
    std::optional<c10::Event> fence;
    {
      std::lock_guard<std::mutex> lock(fence_mutex_);
      fence.swap(fence_);
    }
    if (fence) fence->synchronize();
  }

 private:
  c10::Stream stream(StreamRole role) const {
    switch (role) {
      case StreamRole::kAllGatherCopyIn:
        return copy_in_;
      case StreamRole::kReduceScatter:
        return reduce_scatter_;
      case StreamRole::kCompute:
        break;
    }
    // The compute stream is the one current before FSDP entered any of its own.
    for (const c10::Stream& s : entered_streams()) {
      if (s.device() == device_) return s;
    }
    return impl_.getStream(device_);
  }

  c10::impl::VirtualGuardImpl impl_;
  c10::Device device_;
  c10::Stream copy_in_;
  c10::Stream reduce_scatter_;
  std::mutex fence_mutex_;
  std::optional<c10::Event> fence_;
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<c10::Device, std::unique_ptr<DeviceStreams>> by_device;
  std::shared_ptr<DeviceStreams> override_streams;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: streams may be used at exit
  return *r;
}

}  // namespace

std::unique_ptr<DeviceStreams> make_c10_device_streams(const c10::Device& device) {
  return std::make_unique<C10DeviceStreams>(device);
}

DeviceStreams* device_streams_for(const c10::Device& device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.override_streams) return r.override_streams.get();
  if (device.is_cpu() || device.is_meta()) return nullptr;
  const c10::Device key =
      device.has_index() ? device : c10::impl::VirtualGuardImpl(device.type()).getDevice();
  std::unique_ptr<DeviceStreams>& slot = r.by_device[key];
  if (!slot) slot = make_c10_device_streams(key);
  return slot.get();
}

ScopedDeviceStreamsOverride::ScopedDeviceStreamsOverride(std::shared_ptr<DeviceStreams> streams) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.override_streams = std::move(streams);
}

ScopedDeviceStreamsOverride::~ScopedDeviceStreamsOverride() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.override_streams.reset();
}

}  // namespace tdist::fsdp::detail

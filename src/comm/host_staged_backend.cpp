#include "comm/host_staged_backend.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "tdist/error.h"

namespace tdist::detail {

namespace {

/// The copies of one collective: in to pinned host memory, back to the device, both on a
/// side stream ordered after (and before) the caller's current stream.
class Staging {
 public:
  explicit Staging(c10::Device device)
      : device_(device),
        impl_(device.type()),
        caller_(impl_.getStream(device)),
        side_(impl_.getStreamFromGlobalPool(device, false)) {
    c10::Event ready(device.type());
    ready.record(caller_);
    ready.block(side_);
  }

  at::Tensor to_host(const at::Tensor& t) {
    c10::StreamGuard on_side(side_);
    at::Tensor host = empty_host_like(t);
    host.copy_(t, /*non_blocking=*/true);
    return host;
  }
  at::Tensor empty_host_like(const at::Tensor& t) const {
    return at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  }
  /// Blocks until every to_host copy has landed.
  void host_ready() const {
    c10::Event copied(device_.type());
    copied.record(side_);
    copied.synchronize();
  }
  /// The copy writes `dst` on the side stream: marked in use there, so a caller that drops
  /// `dst` at once cannot have its memory handed to another stream before the copy is done.
  void to_device(at::Tensor& dst, const at::Tensor& host) {
    c10::StreamGuard on_side(side_);
    dst.copy_(host, /*non_blocking=*/true);
    if (dst.numel() > 0) impl_.recordDataPtrOnStream(dst.storage().data_ptr(), side_);
  }
  /// The caller's stream waits for the copies back (the host does not); returns the event
  /// that marks them, for a later wait on another stream.
  c10::Event done() const {
    c10::Event back(device_.type());
    back.record(side_);
    back.block(caller_);
    return back;
  }
  const c10::Device& device() const { return device_; }

 private:
  c10::Device device_;
  c10::impl::VirtualGuardImpl impl_;
  c10::Stream caller_;
  c10::Stream side_;
};

/// A staged collective's Work: complete when returned (the host collective is done), and its
/// wait() also makes the stream current then wait for the copies back, as c10d's Gloo work on
/// CUDA tensors does, for a caller that issued on one stream and reads on another.
class StagedWork : public Work {
 public:
  StagedWork(std::string op, std::vector<at::Tensor> outputs, c10::Event copied_back,
             c10::Device device)
      : Work(std::move(op), std::move(outputs)),
        copied_back_(std::move(copied_back)),
        device_(device) {
    finish();
  }

  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) override {
    copied_back_.block(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
    return Work::wait(timeout);
  }

 private:
  c10::Event copied_back_;
  c10::Device device_;
};

std::vector<at::Tensor> to_host_all(Staging& s, const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(s.to_host(t));
  return out;
}

std::vector<at::Tensor> empty_host_all(Staging& s, const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(s.empty_host_like(t));
  return out;
}

class HostStagedBackend : public CollectiveBackend {
 public:
  HostStagedBackend(CollectiveBackendPtr host, c10::DeviceType type)
      : CollectiveBackend(host->rank(), host->size()), host_(std::move(host)), type_(type) {}

  std::string name() const override { return host_->name(); }
  bool takes_device_tensors(c10::DeviceType type) const override {
    return type == type_ || host_->takes_device_tensors(type);
  }

  WorkPtr broadcast(at::Tensor& tensor, const BroadcastOptions& opts) override {
    return in_place("broadcast", tensor, [&](at::Tensor& h) { return host_->broadcast(h, opts); });
  }
  WorkPtr all_reduce(at::Tensor& tensor, const AllreduceOptions& opts) override {
    return in_place("all_reduce", tensor,
                    [&](at::Tensor& h) { return host_->all_reduce(h, opts); });
  }
  WorkPtr reduce(at::Tensor& tensor, const ReduceOptions& opts) override {
    return in_place("reduce", tensor, [&](at::Tensor& h) { return host_->reduce(h, opts); });
  }
  WorkPtr all_reduce_coalesced(std::vector<at::Tensor>& tensors,
                               const AllreduceOptions& opts) override {
    Staging s(device_of(tensors.at(0)));
    auto host = to_host_all(s, tensors);
    s.host_ready();
    host_->all_reduce_coalesced(host, opts)->wait();
    for (size_t i = 0; i < tensors.size(); ++i) s.to_device(tensors[i], host[i]);
    return finish(s, "all_reduce_coalesced", tensors);
  }
  WorkPtr all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                                 const AllgatherOptions& opts) override {
    Staging s(device_of(input));
    at::Tensor in = s.to_host(input), out = s.empty_host_like(output);
    s.host_ready();
    host_->all_gather_into_tensor(out, in, opts)->wait();
    s.to_device(output, out);
    return finish(s, "all_gather_into_tensor", {output});
  }
  WorkPtr all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                     const AllgatherOptions& opts) override {
    Staging s(device_of(input));
    at::Tensor in = s.to_host(input);
    auto out = empty_host_all(s, outputs);
    s.host_ready();
    host_->all_gather(out, in, opts)->wait();
    for (size_t i = 0; i < outputs.size(); ++i) s.to_device(outputs[i], out[i]);
    return finish(s, "all_gather", outputs);
  }
  WorkPtr gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                 const GatherOptions& opts) override {
    Staging s(device_of(input));
    at::Tensor in = s.to_host(input);
    auto out = empty_host_all(s, outputs);
    s.host_ready();
    host_->gather(out, in, opts)->wait();
    for (size_t i = 0; i < outputs.size(); ++i) s.to_device(outputs[i], out[i]);
    return finish(s, "gather", outputs);
  }
  WorkPtr scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                  const ScatterOptions& opts) override {
    Staging s(device_of(output));
    auto in = to_host_all(s, inputs);
    at::Tensor out = s.empty_host_like(output);
    s.host_ready();
    host_->scatter(out, in, opts)->wait();
    s.to_device(output, out);
    return finish(s, "scatter", {output});
  }
  WorkPtr reduce_scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs,
                         const ReduceScatterOptions& opts) override {
    Staging s(device_of(output));
    auto in = to_host_all(s, inputs);
    at::Tensor out = s.empty_host_like(output);
    s.host_ready();
    host_->reduce_scatter(out, in, opts)->wait();
    s.to_device(output, out);
    return finish(s, "reduce_scatter", {output});
  }
  WorkPtr reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input,
                                const ReduceScatterOptions& opts) override {
    Staging s(device_of(input));
    at::Tensor in = s.to_host(input), out = s.empty_host_like(output);
    s.host_ready();
    host_->reduce_scatter_tensor(out, in, opts)->wait();
    s.to_device(output, out);
    return finish(s, "reduce_scatter_tensor", {output});
  }
  WorkPtr all_to_all(std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                     const AllToAllOptions& opts) override {
    Staging s(device_of(inputs.at(0)));
    auto in = to_host_all(s, inputs);
    auto out = empty_host_all(s, outputs);
    s.host_ready();
    host_->all_to_all(out, in, opts)->wait();
    for (size_t i = 0; i < outputs.size(); ++i) s.to_device(outputs[i], out[i]);
    return finish(s, "all_to_all", outputs);
  }
  WorkPtr all_to_all_single(at::Tensor& output, const at::Tensor& input,
                            const std::vector<int64_t>& output_split_sizes,
                            const std::vector<int64_t>& input_split_sizes,
                            const AllToAllOptions& opts) override {
    Staging s(device_of(input));
    at::Tensor in = s.to_host(input), out = s.empty_host_like(output);
    s.host_ready();
    host_->all_to_all_single(out, in, output_split_sizes, input_split_sizes, opts)->wait();
    s.to_device(output, out);
    return finish(s, "all_to_all_single", {output});
  }
  WorkPtr barrier(const BarrierOptions& opts) override { return host_->barrier(opts); }
  WorkPtr send(const at::Tensor& tensor, int, const SendRecvOptions&) override {
    not_staged("send", tensor);
  }
  WorkPtr recv(at::Tensor& tensor, int, const SendRecvOptions&) override {
    not_staged("recv", tensor);
  }
  WorkPtr recv_anysource(at::Tensor& tensor, const SendRecvOptions&) override {
    not_staged("recv", tensor);
  }

 private:
  c10::Device device_of(const at::Tensor& t) const {
    if (t.device().type() != type_) {
      TDIST_THROW(InvalidArgument, host_->name() + ": a " + c10::DeviceTypeName(type_) +
                                       " collective got a tensor on " + t.device().str());
    }
    return t.device();
  }

  template <typename Run>
  WorkPtr in_place(const std::string& op, at::Tensor& tensor, Run run) {
    Staging s(device_of(tensor));
    at::Tensor host = s.to_host(tensor);
    s.host_ready();
    run(host)->wait();
    s.to_device(tensor, host);
    return finish(s, op, {tensor});
  }

  WorkPtr finish(const Staging& s, const std::string& op, std::vector<at::Tensor> outputs) const {
    return std::make_shared<StagedWork>(op, std::move(outputs), s.done(), s.device());
  }

  [[noreturn]] void not_staged(const std::string& op, const at::Tensor& t) const {
    TDIST_THROW(InvalidArgument,
                host_->name() + " does not " + op + " tensors on " + t.device().str() +
                    " (as c10d's gloo); use backend \"cpu:gloo,cuda:nccl\" for device "
                    "point-to-point, or move the tensor to the CPU");
  }

  CollectiveBackendPtr host_;
  c10::DeviceType type_;
};

}  // namespace

CollectiveBackendPtr stage_through_host(CollectiveBackendPtr host, c10::DeviceType device_type) {
  return std::make_shared<HostStagedBackend>(std::move(host), device_type);
}

}  // namespace tdist::detail

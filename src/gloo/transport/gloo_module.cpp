// The Gloo transport module (Note [One Gloo per symbol scope] in transport.h): the only
// translation unit that includes Gloo. Built into its own shared object against Debian's
// libgloo, embedded in tdist_comm and loaded privately; everything here is hidden but the
// entry point at the bottom.

#include <dlfcn.h>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "gloo/transport/transport.h"

namespace tdist::detail::gloo_transport {
namespace {

// Runs `body`, turning what Gloo throws into a TransportError of `kind` (IoException: kIo,
// whatever `kind` says otherwise). Anything else passes through as it is: the rendezvous
// store's own errors (tdist's, thrown by the engine's KeyValueStore) keep their type.
template <typename Body>
auto translated(TransportError::Kind kind, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const gloo::IoException& e) {
    throw TransportError(TransportError::Kind::kIo, e.what());
  } catch (const gloo::Exception& e) {
    throw TransportError(kind, e.what());
  } catch (const gloo::EnforceNotMet& e) {
    throw TransportError(kind, e.what());
  }
}

class GlooBuffer final : public Buffer {
 public:
  explicit GlooBuffer(std::unique_ptr<gloo::transport::UnboundBuffer> buffer)
      : buffer_(std::move(buffer)) {}

  void send(int peer, uint64_t slot, size_t offset, size_t bytes) override {
    translated(TransportError::Kind::kIo, [&] { buffer_->send(peer, slot, offset, bytes); });
  }
  void recv(int peer, uint64_t slot, size_t offset, size_t bytes) override {
    translated(TransportError::Kind::kIo, [&] { buffer_->recv(peer, slot, offset, bytes); });
  }
  void recv_any(const std::vector<int>& peers, uint64_t slot, size_t offset,
                size_t bytes) override {
    translated(TransportError::Kind::kIo, [&] { buffer_->recv(peers, slot, offset, bytes); });
  }
  bool wait_send(std::chrono::milliseconds timeout) override {
    return translated(TransportError::Kind::kIo,
                      [&] { return buffer_->waitSend(nullptr, timeout); });
  }
  bool wait_recv(std::chrono::milliseconds timeout, int* source) override {
    return translated(TransportError::Kind::kIo,
                      [&] { return buffer_->waitRecv(source, timeout); });
  }
  void abort_wait_send() override { buffer_->abortWaitSend(); }
  void abort_wait_recv() override { buffer_->abortWaitRecv(); }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
};

class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(KeyValueStore& store, std::chrono::milliseconds timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    store_.wait({key}, timeout_);
    return store_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  KeyValueStore& store_;
  std::chrono::milliseconds timeout_;
};

class GlooContext final : public Context {
 public:
  explicit GlooContext(std::shared_ptr<gloo::rendezvous::Context> context)
      : context_(std::move(context)) {}

  std::unique_ptr<Buffer> buffer(void* ptr, size_t bytes) override {
    return std::make_unique<GlooBuffer>(translated(
        TransportError::Kind::kOther, [&] { return context_->createUnboundBuffer(ptr, bytes); }));
  }
  void close_connections() override {
    translated(TransportError::Kind::kIo, [&] { context_->closeConnections(); });
  }

 private:
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

class GlooModule final : public Module {
 public:
  int abi_version() const override { return kAbiVersion; }

  std::unique_ptr<Context> connect(const DeviceAddress& where, KeyValueStore& store,
                                   const std::string& prefix, int rank, int size,
                                   std::chrono::milliseconds timeout) override {
    gloo::transport::tcp::attr attr;
    attr.iface = where.interface;
    if (where.interface.empty()) attr.hostname = where.address;
    auto device = translated(TransportError::Kind::kDevice,
                             [&] { return gloo::transport::tcp::CreateDevice(attr); });
    StoreAdapter adapter(store, timeout);
    gloo::rendezvous::PrefixStore prefixed(prefix, adapter);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    translated(TransportError::Kind::kOther, [&] { context->connectFullMesh(prefixed, device); });
    return std::make_unique<GlooContext>(std::move(context));
  }

  std::string gloo_library_path() const override {
    Dl_info info{};
    const auto symbol = &gloo::transport::tcp::CreateDevice;
    if (dladdr(reinterpret_cast<void*>(symbol), &info) == 0 || info.dli_fname == nullptr) return "";
    return info.dli_fname;
  }
};

}  // namespace
}  // namespace tdist::detail::gloo_transport

extern "C" __attribute__((visibility("default"))) tdist::detail::gloo_transport::Module*
tdist_gloo_transport_module() {
  static tdist::detail::gloo_transport::GlooModule module;
  return &module;
}

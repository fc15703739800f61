#pragma once

// The Gloo transport as tdist's engine sees it: full-mesh TCP contexts and tagged,
// zero-copy send/recv buffers, with no Gloo type in sight.
//
// Note [One Gloo per symbol scope] (docs/gloo.md): PyTorch's LibTorch carries its own Gloo
// inside libtorch_cpu.so (its symbols, not its headers), three years newer than Debian's
// libgloo whose headers tdist compiles against, with another ABI (Store's vtable,
// connectFullMesh's signature, the TCP pair's members). Both in one symbol scope would mix:
// whichever loads first serves every `gloo::` call of both. So the only code that touches
// Gloo is the small module behind this interface (gloo_module.cpp), built against
// Debian's headers and libgloo, embedded in tdist and loaded with RTLD_LOCAL |
// RTLD_DEEPBIND: its Gloo calls bind to libgloo.so.0, LibTorch's to its own copy, and
// neither sees the other. Only this interface crosses: virtual calls, std:: types.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace tdist::detail::gloo_transport {

/// Bumped whenever a declaration below changes; the module must report the same.
constexpr int kAbiVersion = 2;

/// Every error the module raises. `kind` says where it came from, `what()` is Gloo's text.
// Default visibility: the module throws it across the boundary, the engine catches it.
class __attribute__((visibility("default"))) TransportError : public std::runtime_error {
 public:
  enum class Kind { kDevice, kIo, kOther };
  TransportError(Kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

/// A registered memory region of `bytes` bytes (gloo's UnboundBuffer).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void send(int peer, uint64_t slot, size_t offset, size_t bytes) = 0;
  virtual void recv(int peer, uint64_t slot, size_t offset, size_t bytes) = 0;
  /// A receive from whichever of `peers` sends on `slot` first (gloo's recv from a rank list).
  virtual void recv_any(const std::vector<int>& peers, uint64_t slot, size_t offset,
                        size_t bytes) = 0;
  /// False when aborted; throws TransportError on a failed connection or timeout.
  virtual bool wait_send(std::chrono::milliseconds timeout) = 0;
  /// `source` (if given) receives the sender's rank.
  virtual bool wait_recv(std::chrono::milliseconds timeout, int* source = nullptr) = 0;
  virtual void abort_wait_send() = 0;
  virtual void abort_wait_recv() = 0;
};

/// The rendezvous key-value store, implemented by the engine on a tdist Store.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

/// Where a device binds: a network interface name, else a numeric address.
struct DeviceAddress {
  std::string interface;
  std::string address;
};

/// One connected full mesh (gloo's rendezvous Context on its own TCP device).
class Context {
 public:
  virtual ~Context() = default;
  virtual std::unique_ptr<Buffer> buffer(void* ptr, size_t bytes) = 0;
  virtual void close_connections() = 0;
};

/// What the module exports.
class Module {
 public:
  virtual ~Module() = default;
  virtual int abi_version() const = 0;
  /// Creates a device at `where` and connects rank `rank` of `size` to every peer through
  /// `store` (keys under `prefix`).
  virtual std::unique_ptr<Context> connect(const DeviceAddress& where, KeyValueStore& store,
                                           const std::string& prefix, int rank, int size,
                                           std::chrono::milliseconds timeout) = 0;
  /// The file of the shared object that the module's Gloo calls bind to.
  virtual std::string gloo_library_path() const = 0;
};

/// The module, loaded once per process (throws tdist::DistBackendError naming the cause when
/// it cannot be loaded, e.g. libgloo.so.0 is missing).
Module& module();

/// The file the process's global symbol scope resolves `gloo::transport::tcp::CreateDevice`
/// to (LibTorch's libtorch_cpu.so when it carries Gloo), or "" when nothing there defines it.
std::string global_gloo_library_path();

}  // namespace tdist::detail::gloo_transport

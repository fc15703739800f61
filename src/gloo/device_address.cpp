#include "gloo/device_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <memory>

#include "tdist/error.h"

namespace tdist::detail {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, int socktype) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  addrinfo* result = nullptr;
  // "9" (discard) only gives the UDP probe a port to aim at; nothing is sent to it.
  if (getaddrinfo(host.c_str(), "9", &hints, &result) != 0) return nullptr;
  return AddrInfoPtr(result);
}

std::optional<std::string> numeric(const sockaddr* addr, socklen_t len) {
  char text[NI_MAXHOST] = {0};
  if (getnameinfo(addr, len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0)
    return std::nullopt;
  return std::string(text);
}

std::string host_name() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

void warn_loopback_once(const std::string& why) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  std::cerr << "tdist: warning: " << why
            << "; gloo uses the loopback address (127.0.0.1), which reaches ranks on this host "
               "only. Set GLOO_SOCKET_IFNAME to the network interface to bind to (see `ip "
               "addr`) for a job across hosts.\n"
            << std::flush;
}

}  // namespace

std::optional<std::string> local_address_toward(const std::string& host) {
  AddrInfoPtr info = resolve(host, SOCK_DGRAM);
  for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    const bool ok = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
                    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    close(fd);
    if (ok) return numeric(reinterpret_cast<sockaddr*>(&local), len);
  }
  return std::nullopt;
}

std::optional<std::string> bindable_address_of(const std::string& name) {
  if (name.empty()) return std::nullopt;
  AddrInfoPtr info = resolve(name, SOCK_STREAM);
  for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // Port 0: only whether the address is this host's matters.
    if (ai->ai_family == AF_INET) reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_port = 0;
    if (ai->ai_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_port = 0;
    const bool ok = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    close(fd);
    if (ok) return numeric(ai->ai_addr, ai->ai_addrlen);
  }
  return std::nullopt;
}

bool is_loopback(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

namespace {

// The one numeric address every channel binds when no interface is given.
std::string choose_address(const gloo::GlooBackendOptions& options, int rank) {
  const std::string who = "rank " + std::to_string(rank) + ": ";
  if (!options.hostname().empty()) {
    if (auto address = bindable_address_of(options.hostname())) return *address;
    TDIST_THROW(InvalidArgument, who + "gloo cannot bind the host name '" + options.hostname() +
                                     "': it does not resolve to an address of this machine; "
                                     "give an address of this host or set GLOO_SOCKET_IFNAME");
  }
  if (!options.store_host().empty()) {
    // The address this host uses to reach the store's host is one the other hosts can reach
    // back, whatever the machine's host name says; and when that is loopback, the store
    // itself is only reachable from this host, so every rank that reached it is here.
    if (auto address = local_address_toward(options.store_host())) return *address;
  }
  // Several hosts for all we know: LOCAL_WORLD_SIZE < WORLD_SIZE (ranks meeting through a
  // file:// store, say). Loopback cannot serve them.
  const bool several_hosts = options.single_host().has_value() && !*options.single_host();
  const std::string name = host_name();
  const auto own = bindable_address_of(name);
  if (own && (!is_loopback(*own) || !several_hosts)) return *own;
  std::string why = "the host name '" + name + "' " +
                    (own ? "resolves only to the loopback address " + *own
                         : std::string("does not resolve to an address of this machine"));
  if (!options.store_host().empty())
    why += " and no route leads to the store host '" + options.store_host() + "' (MASTER_ADDR)";
  if (!several_hosts) {
    warn_loopback_once(who + why);
    return "127.0.0.1";
  }
  TDIST_THROW(InvalidArgument,
              who + "gloo has no address other hosts can reach: " + why +
                  ", and this job runs on several hosts (LOCAL_WORLD_SIZE < WORLD_SIZE). Set "
                  "GLOO_SOCKET_IFNAME to the network interface to use (see `ip addr`), or map "
                  "the host name to this machine's address in /etc/hosts");
}

}  // namespace

std::vector<gloo_transport::DeviceAddress> choose_device_addresses(
    const gloo::GlooBackendOptions& options, int channels, int rank) {
  const auto& interfaces = options.interfaces();
  std::vector<gloo_transport::DeviceAddress> out;
  if (!interfaces.empty()) {
    for (int c = 0; c < channels; ++c) out.push_back({interfaces[c % interfaces.size()], ""});
    return out;
  }
  // Resolved once: every channel binds the same address.
  out.assign(channels, {"", choose_address(options, rank)});
  return out;
}

}  // namespace tdist::detail

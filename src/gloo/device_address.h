#pragma once

// Which local address a Gloo device binds when GLOO_SOCKET_IFNAME is unset (docs/gloo.md
// "Which address gloo binds"). Gloo itself resolves whatever host name it is handed and
// crashes when that fails (its getaddrinfo result is read even on error), so tdist hands it
// only numeric addresses it has checked.

#include <optional>
#include <string>
#include <vector>

#include "gloo/transport/transport.h"
#include "tdist/gloo/gloo_backend.h"

namespace tdist::detail {

/// The numeric local address whose route leads to `host` (a name or address), found by
/// connecting a UDP socket (nothing is sent); nullopt when `host` does not resolve or has no
/// route.
std::optional<std::string> local_address_toward(const std::string& host);

/// The first numeric address `name` resolves to that this host can bind; nullopt when it
/// does not resolve or none can be bound.
std::optional<std::string> bindable_address_of(const std::string& name);

/// Whether `address` (numeric) is a loopback address (127.0.0.0/8, ::1).
bool is_loopback(const std::string& address);

/// The devices of rank `rank`'s `channels` channels: the interfaces from GLOO_SOCKET_IFNAME
/// (round-robin), else one address for all of them: the given hostname, else the address that
/// routes to the store host (loopback when the store is on loopback: then every rank is on
/// this host), else the machine's host name (not a loopback address when the job spans
/// hosts), else loopback when the job may be on one host (with one warning); otherwise throws
/// InvalidArgument naming the host name and GLOO_SOCKET_IFNAME.
std::vector<gloo_transport::DeviceAddress> choose_device_addresses(
    const gloo::GlooBackendOptions& options, int channels, int rank);

}  // namespace tdist::detail

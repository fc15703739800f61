#include "comm/rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <random>
#include <thread>

#include <ATen/Context.h>

#include "tdist/comm/backend.h"
#include "tdist/error.h"
#include "tdist/store/file_store.h"
#include "tdist/store/tcp_store.h"

namespace tdist::detail {

namespace {

constexpr const char* kEnvHelp =
    "env:// needs MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (RANK and WORLD_SIZE may "
    "instead be passed to init_process_group); tdistrun, torchrun, srun, mpirun and a "
    "Kubeflow PyTorchJob provide them (docs/launcher.md, \"Other launchers\")";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

std::string ms_text(std::chrono::milliseconds t) {
  return std::to_string(t.count()) + " ms";
}

std::string process_token() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  return std::string(host) + ":pid " + std::to_string(::getpid()) + ":" + std::to_string(rd()) +
         std::to_string(rd());
}

/// The "host:pid N" part of a token, for messages.
std::string who(const std::string& token) {
  auto last = token.rfind(':');
  return last == std::string::npos ? token : token.substr(0, last);
}

StorePtr make_tcp_store(const std::string& how, const std::string& host, int port, int rank,
                        int world_size, std::chrono::milliseconds timeout) {
  TCPStoreOptions opts;
  opts.port(port)
      .is_server(rank == 0)
      .num_workers(world_size)
      .wait_for_workers(false)
      .timeout(timeout)
      .bind_address(host)
      .client_name("rank " + std::to_string(rank))
      .server_name("rank 0");
  const std::string where = host + ":" + std::to_string(port);
  try {
    return std::make_shared<TCPStore>(host, opts);
  } catch (const TimeoutError& e) {
    TDIST_THROW(TimeoutError, "rank " + std::to_string(rank) + ": " + how +
                                  " rendezvous could not reach the master at " + where +
                                  " within " + ms_text(timeout) +
                                  "; check that rank 0 is running and that MASTER_ADDR/"
                                  "MASTER_PORT name its machine (" +
                                  e.what() + ")");
  } catch (const std::exception& e) {
    if (rank == 0) {
      TDIST_THROW(NetworkError, "rank 0: " + how + " rendezvous could not host the store on " +
                                    where +
                                    " (is the port already in use, or the address not "
                                    "on this machine?); choose a free MASTER_PORT (" +
                                    e.what() + ")");
    }
    TDIST_THROW(NetworkError, "rank " + std::to_string(rank) + ": " + how +
                                  " rendezvous could not reach the master at " + where + " (" +
                                  e.what() + ")");
  }
}

}  // namespace

int parse_int(const std::string& what, const std::string& text, int min_value, int max_value) {
  std::string t = trim(text);
  bool ok = !t.empty();
  size_t start = (ok && (t[0] == '-' || t[0] == '+')) ? 1 : 0;
  if (start == t.size()) ok = false;
  for (size_t i = start; ok && i < t.size(); ++i)
    ok = std::isdigit(static_cast<unsigned char>(t[i]));
  long long v = 0;
  if (ok) {
    if (t.size() > 12) {
      ok = false;
    } else {
      v = std::stoll(t);
    }
  }
  if (!ok) {
    TDIST_THROW(InvalidArgument, what + "='" + text + "' is not an integer");
  }
  if (v < min_value || v > max_value) {
    TDIST_THROW(InvalidArgument, what + "=" + t + " is out of range: it must be in [" +
                                     std::to_string(min_value) + ", " + std::to_string(max_value) +
                                     "]");
  }
  return static_cast<int>(v);
}

InitUrl parse_init_method(const std::string& url) {
  InitUrl out;
  auto sep = url.find("://");
  if (sep == std::string::npos) {
    TDIST_THROW(InvalidArgument, "init_method '" + url +
                                     "' is not a URL; use env://, tcp://HOST:PORT or "
                                     "file:///PATH");
  }
  out.scheme = lower(url.substr(0, sep));
  std::string rest = url.substr(sep + 3);
  auto q = rest.find('?');
  if (q != std::string::npos) {
    std::string query = rest.substr(q + 1);
    rest = rest.substr(0, q);
    size_t pos = 0;
    while (pos <= query.size()) {
      size_t amp = query.find('&', pos);
      std::string item =
          query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
      if (!item.empty()) {
        auto eq = item.find('=');
        if (eq == std::string::npos || eq == 0) {
          TDIST_THROW(InvalidArgument, "init_method '" + url + "': malformed query item '" + item +
                                           "' (expected key=value)");
        }
        out.query[item.substr(0, eq)] = item.substr(eq + 1);
      }
      if (amp == std::string::npos) break;
      pos = amp + 1;
    }
  }
  if (out.scheme == "env") {
    if (!rest.empty()) {
      TDIST_THROW(InvalidArgument, "init_method '" + url + "': env:// takes no address (" +
                                       std::string(kEnvHelp) + ")");
    }
  } else if (out.scheme == "tcp") {
    auto colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      TDIST_THROW(InvalidArgument, "init_method '" + url + "': expected tcp://HOST:PORT");
    }
    out.host = rest.substr(0, colon);
    if (out.host.size() > 2 && out.host.front() == '[' && out.host.back() == ']') {
      out.host = out.host.substr(1, out.host.size() - 2);
    }
    out.port = parse_int("the port of init_method '" + url + "'", rest.substr(colon + 1), 1, 65535);
  } else if (out.scheme == "file") {
    if (rest.empty() || rest[0] != '/') {
      TDIST_THROW(InvalidArgument,
                  "init_method '" + url + "': expected file:///ABSOLUTE/PATH (three slashes)");
    }
    out.path = rest;
  } else {
    TDIST_THROW(InvalidArgument, "init_method '" + url + "': unsupported scheme '" + out.scheme +
                                     "'; use env://, tcp://HOST:PORT or file:///PATH");
  }
  for (const auto& [key, value] : out.query) {
    if (key != "rank" && key != "world_size") {
      TDIST_THROW(InvalidArgument, "init_method '" + url + "': unknown query parameter '" + key +
                                       "' (accepted: rank, world_size)");
    }
  }
  return out;
}

RendezvousResult rendezvous(const std::string& init_method, int rank, int world_size,
                            std::chrono::milliseconds timeout) {
  InitUrl url = parse_init_method(init_method.empty() ? "env://" : init_method);
  constexpr int kMaxWorld = 1 << 24;
  auto from_url = [&](const char* key, int current, int min_value) {
    auto it = url.query.find(key);
    if (current >= 0 || it == url.query.end()) return current;
    return parse_int(std::string(key) + " in init_method", it->second, min_value, kMaxWorld);
  };
  rank = from_url("rank", rank, 0);
  world_size = from_url("world_size", world_size, 1);

  RendezvousResult out;
  if (url.scheme == "env") {
    if (rank < 0) {
      const char* v = env("RANK");
      if (v == nullptr) TDIST_THROW(InvalidArgument, std::string("RANK is not set: ") + kEnvHelp);
      rank = parse_int("RANK", v, 0, kMaxWorld);
    }
    if (world_size < 0) {
      const char* v = env("WORLD_SIZE");
      if (v == nullptr) {
        TDIST_THROW(InvalidArgument, std::string("WORLD_SIZE is not set: ") + kEnvHelp);
      }
      world_size = parse_int("WORLD_SIZE", v, 1, kMaxWorld);
    }
    const char* port_text = env("MASTER_PORT");
    if (port_text == nullptr) {
      TDIST_THROW(InvalidArgument, std::string("MASTER_PORT is not set: ") + kEnvHelp);
    }
    int port = parse_int("MASTER_PORT", port_text, 1, 65535);
    const char* addr = env("MASTER_ADDR");
    // Required on every rank, rank 0 included, as in torch.distributed: a default of
    // 127.0.0.1 on rank 0 alone would hide a launcher that forgot it until the other ranks run.
    if (addr == nullptr) {
      TDIST_THROW(InvalidArgument,
                  "MASTER_ADDR is not set on rank " + std::to_string(rank) +
                      " (every rank needs rank 0's address, rank 0 included): " + kEnvHelp);
    }
    std::string host = addr;
    if (rank >= world_size) {
      TDIST_THROW(InvalidArgument, "RANK=" + std::to_string(rank) +
                                       " is not below WORLD_SIZE=" + std::to_string(world_size) +
                                       "; ranks run from 0 to WORLD_SIZE-1");
    }
    out.description = "env:// (MASTER_ADDR=" + host + ", MASTER_PORT=" + std::to_string(port) + ")";
    out.store = make_tcp_store("env://", host, port, rank, world_size, timeout);
  } else {
    if (rank < 0 || world_size < 0) {
      TDIST_THROW(InvalidArgument, "init_method '" + init_method +
                                       "' needs rank and world_size, given to "
                                       "init_process_group or as ?rank=R&world_size=N");
    }
    if (rank >= world_size) {
      TDIST_THROW(InvalidArgument, "rank " + std::to_string(rank) + " is not below world_size " +
                                       std::to_string(world_size) +
                                       "; ranks run from 0 to world_size-1");
    }
    if (url.scheme == "tcp") {
      out.description = init_method;
      out.store = make_tcp_store("tcp://", url.host, url.port, rank, world_size, timeout);
    } else {
      out.description = "file://" + url.path;
      try {
        out.store = std::make_shared<FileStore>(url.path, world_size, timeout);
      } catch (const Error& e) {
        TDIST_THROW(StoreError, "rank " + std::to_string(rank) + ": file:// rendezvous on '" +
                                    url.path + "' failed: " + e.what());
      }
    }
  }
  out.rank = rank;
  out.world_size = world_size;
  return out;
}

namespace {

/// Polls until every key exists; throws the message stored at error_key as soon as one
/// appears, and after the timeout names the ranks whose keys are missing.
void wait_for_ranks(Store& store, const std::vector<std::string>& keys,
                    const std::string& error_key, int rank, int world_size,
                    std::chrono::milliseconds timeout, const std::string& waiting_for,
                    const std::function<void()>& on_poll) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto sleep = std::chrono::milliseconds(1);
  while (true) {
    if (store.check({error_key})) {
      TDIST_THROW(InvalidArgument, "rank " + std::to_string(rank) +
                                       ": rendezvous failed: " + store.get_string(error_key));
    }
    if (on_poll) on_poll();
    if (store.check(keys)) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string missing;
      int joined = 0;
      for (int r = 0; r < world_size; ++r) {
        if (store.check({keys[r]})) {
          ++joined;
        } else {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      TDIST_THROW(TimeoutError,
                  "rank " + std::to_string(rank) + ": rendezvous timed out after " +
                      ms_text(timeout) + ": expected WORLD_SIZE=" + std::to_string(world_size) +
                      " processes but only " + std::to_string(joined) + " " + waiting_for +
                      " (missing ranks: " + missing +
                      "); start every rank, or lower WORLD_SIZE to the number started");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace

namespace {

void register_ranks_impl(Store& store, const std::string& prefix, int rank, int world_size,
                         std::chrono::milliseconds timeout) {
  const std::string my_world = "world_size=" + std::to_string(world_size);
  const std::string token = my_world + "|" + process_token();
  const std::string my_key = prefix + "rank/" + std::to_string(rank);
  const std::string error_key = prefix + "error";
  auto to_bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  auto fail_all = [&](const std::string& msg) {
    store.set(error_key, msg);
    TDIST_THROW(InvalidArgument, "rank " + std::to_string(rank) + ": rendezvous failed: " + msg);
  };
  auto claimed = store.compare_set(my_key, {}, to_bytes(token));
  std::string holder(claimed.begin(), claimed.end());
  if (holder != token) {
    fail_all("duplicate rank: RANK " + std::to_string(rank) + " was claimed by two processes (" +
             who(holder.substr(holder.find('|') + 1)) + " and " +
             who(token.substr(token.find('|') + 1)) +
             "); every process needs a distinct RANK in [0, WORLD_SIZE)");
  }
  const auto start = std::chrono::steady_clock::now();

  // Everyone must agree on the world size; rank 0's announcement is the reference, checked
  // as soon as it is visible so that a mismatch never turns into a timeout.
  bool compared = false;
  auto compare_with_rank0 = [&] {
    if (compared || !store.check({prefix + "rank/0"})) return;
    compared = true;
    std::string first = store.get_string(prefix + "rank/0");
    std::string theirs = first.substr(0, first.find('|'));
    if (theirs != my_world) {
      fail_all("WORLD_SIZE mismatch: rank " + std::to_string(rank) + " has " + my_world +
               " but rank 0 has " + theirs + "; give every process the same WORLD_SIZE");
    }
  };
  std::vector<std::string> keys, ok_keys;
  for (int r = 0; r < world_size; ++r) {
    keys.push_back(prefix + "rank/" + std::to_string(r));
    ok_keys.push_back(prefix + "ok/" + std::to_string(r));
  }
  wait_for_ranks(store, keys, error_key, rank, world_size, timeout, "joined", compare_with_rank0);
  compare_with_rank0();
  // Second phase: nobody leaves until everyone has passed its checks, so an error found by
  // one rank reaches all of them.
  store.set(ok_keys[rank], std::string("1"));
  auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start);
  wait_for_ranks(store, ok_keys, error_key, rank, world_size,
                 std::max(left, std::chrono::milliseconds(1000)), "passed the rendezvous checks",
                 nullptr);
}

/// Publishes a rendezvous failure so every rank reports it, and keeps rank 0 (which usually
/// hosts the TCP store) alive until the others have read it: otherwise they would only see
/// "connection closed". Best effort: the store may already be gone.
void report_failure(Store& store, const std::string& prefix, int rank, const std::string& what) {
  try {
    const std::string error_key = prefix + "error";
    store.compare_set(error_key, {}, std::vector<uint8_t>(what.begin(), what.end()));
    int64_t failed = store.add(prefix + "failed", 1);
    if (rank != 0) return;
    // At least a moment even when every joined rank has reported: a late rank may still be
    // joining and must read the error rather than find the store gone.
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::seconds(3);
    while ((failed < store.add(prefix + "joined", 0) ||
            std::chrono::steady_clock::now() < start + std::chrono::seconds(1)) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      failed = store.add(prefix + "failed", 0);
    }
  } catch (const std::exception&) {
  }
}

}  // namespace

void register_ranks(Store& store, const std::string& prefix, int rank, int world_size,
                    std::chrono::milliseconds timeout) {
  try {
    register_ranks_impl(store, prefix, rank, world_size, timeout);
  } catch (const std::exception& e) {
    report_failure(store, prefix, rank, e.what());
    throw;
  }
}

/// Whether this machine has a device of `device_type`.
static bool device_present(const std::string& device_type) {
  if (device_type == "cpu") return true;
  if (device_type == "cuda") return at::hasCUDA() && at::getNumGPUs() > 0;
  return false;
}

std::map<std::string, std::string> parse_backend_spec(const std::string& spec,
                                                      const std::string& device_id) {
  std::map<std::string, std::string> out;
  std::string s = lower(trim(spec));
  std::string device_type = lower(device_id.substr(0, device_id.find(':')));
  if (s.empty() || s == Backend::UNDEFINED) {
    // Each device type present on this machine gets its default backend (nccl only where
    // there is a GPU), and the one device_id names gets it even if absent: then its
    // backend's factory says why it cannot run.
    for (const auto& [device, name] : Backend::default_device_backend_map()) {
      const bool wanted = device_present(device) || device == device_type;
      if (wanted && backend_registered(name)) out[device] = name;
    }
    if (!device_type.empty() && !out.count(device_type)) {
      auto defaults = Backend::default_device_backend_map();
      auto it = defaults.find(device_type);
      if (it == defaults.end()) {
        TDIST_THROW(InvalidArgument, "device_id '" + device_id +
                                         "': no backend serves device type '" + device_type + "'");
      }
      backend_factory(it->second);  // throws naming why it is unavailable
    }
    if (out.empty()) {
      TDIST_THROW(InvalidArgument, "no usable backend is registered in this build");
    }
    return out;
  }
  if (s.find(':') == std::string::npos) {
    Backend name(s);  // validates
    for (const auto& device : backend_devices(name.str())) out[device] = name.str();
    if (out.empty()) out["cpu"] = name.str();
    return out;
  }
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item =
        trim(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    auto colon = item.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == item.size()) {
      TDIST_THROW(InvalidArgument, "backend '" + spec + "': malformed item '" + item +
                                       "'; expected DEVICE:BACKEND pairs such as "
                                       "\"cpu:gloo,cuda:nccl\"");
    }
    std::string device = trim(item.substr(0, colon));
    Backend name(trim(item.substr(colon + 1)));
    if (out.count(device)) {
      TDIST_THROW(InvalidArgument,
                  "backend '" + spec + "': device '" + device + "' is given twice");
    }
    out[device] = name.str();
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace tdist::detail

#pragma once

// Internal: how init_process_group finds its peers. Parses init_method URLs and the env://
// variables, creates the store (rank 0 hosts the TCP store), and registers every rank in it
// so that a missing process or a duplicate RANK is reported instead of hanging.

#include <chrono>
#include <map>
#include <string>

#include "tdist/store/store.h"

namespace tdist::detail {

struct InitUrl {
  std::string scheme;  // "env", "tcp", "file"
  std::string host;    // tcp
  int port = -1;       // tcp
  std::string path;    // file
  std::map<std::string, std::string> query;
};

/// Parses "env://", "tcp://host:port", "file:///path", each with optional ?rank=&world_size=.
InitUrl parse_init_method(const std::string& url);

/// Parses a decimal integer named `what` (an env var or URL field); throws InvalidArgument
/// naming it when malformed or out of [min_value, max_value].
int parse_int(const std::string& what, const std::string& text, int min_value, int max_value);

struct RendezvousResult {
  StorePtr store;
  int rank = -1;
  int world_size = -1;
  std::string description;  // e.g. "env:// (MASTER_ADDR=127.0.0.1, MASTER_PORT=29500)"
};

/// Resolves rank/world size (arguments win over the URL, which wins over the environment)
/// and creates the store. rank/world_size < 0 mean "not given".
RendezvousResult rendezvous(const std::string& init_method, int rank, int world_size,
                            std::chrono::milliseconds timeout);

/// Every rank announces itself under `prefix`; returns once all world_size ranks have.
/// Throws naming a duplicate RANK, a WORLD_SIZE mismatch, or (after timeout) the missing
/// ranks, expected vs joined.
void register_ranks(Store& store, const std::string& prefix, int rank, int world_size,
                    std::chrono::milliseconds timeout);

/// "gloo" | "cpu:gloo,cuda:nccl" | "" (defaults for every usable device type; device_id
/// such as "cuda:0" requires its device's default) -> device type -> backend name.
std::map<std::string, std::string> parse_backend_spec(const std::string& spec,
                                                      const std::string& device_id);

}  // namespace tdist::detail

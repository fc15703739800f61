#include "checkpoint/fault.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "tdist/error.h"

namespace tdist::checkpoint {

namespace {
constexpr SavePhase kPhases[] = {SavePhase::kPlan,     SavePhase::kWrite,  SavePhase::kAfterWrite,
                                 SavePhase::kMetadata, SavePhase::kCommit, SavePhase::kAfterCommit};
}  // namespace

std::string to_string(SavePhase phase) {
  switch (phase) {
    case SavePhase::kPlan:
      return "plan";
    case SavePhase::kWrite:
      return "write";
    case SavePhase::kAfterWrite:
      return "after_write";
    case SavePhase::kMetadata:
      return "metadata";
    case SavePhase::kCommit:
      return "commit";
    case SavePhase::kAfterCommit:
      return "after_commit";
  }
  return "?";
}

namespace detail {

FaultInjection resolve_fault(const FaultInjection& from_options) {
  const char* env = std::getenv("TDIST_CHECKPOINT_FAULT");
  if (env == nullptr || *env == '\0') return from_options;
  const std::string spec(env);
  const auto c1 = spec.find(':');
  TDIST_CHECK_ARG(c1 != std::string::npos,
                  "TDIST_CHECKPOINT_FAULT='" + spec + "': expected <rank>:<phase>[:kill]");
  const auto c2 = spec.find(':', c1 + 1);
  FaultInjection f;
  f.rank = std::atoi(spec.substr(0, c1).c_str());
  const std::string phase =
      spec.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1);
  bool found = false;
  for (SavePhase p : kPhases) {
    if (to_string(p) == phase) {
      f.phase = p;
      found = true;
    }
  }
  TDIST_CHECK_ARG(found, "TDIST_CHECKPOINT_FAULT='" + spec + "': unknown phase '" + phase +
                             "' (plan, write, after_write, metadata, commit, after_commit)");
  f.kill = c2 != std::string::npos && spec.substr(c2 + 1) == "kill";
  return f;
}

void maybe_inject(const FaultInjection& fault, int rank, SavePhase phase) {
  if (fault.rank != rank || fault.phase != phase) return;
  if (fault.kill) {
    ::kill(::getpid(), SIGKILL);
    ::pause();
  }
  TDIST_THROW(CheckpointError, "checkpoint: injected fault on rank " + std::to_string(rank) +
                                   " at phase " + to_string(phase));
}

}  // namespace detail
}  // namespace tdist::checkpoint

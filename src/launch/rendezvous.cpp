#include "tdist/launch/rendezvous.h"

#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <thread>

#include "launch/process_util.h"
#include "tdist/launch/worker_output.h"

namespace tdist::launch {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {
constexpr milliseconds kPollStep{20};

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string text(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}
std::string seconds_text(milliseconds d) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << static_cast<double>(d.count()) / 1000.0 << " s";
  return out.str();
}
void rendezvous_note(const std::string& message) {
  std::string line = "tdistrun: " + message + "\n";
  write_all(2, line.data(), line.size());
}
}  // namespace

bool should_make_store_secret(const LaunchConfig& config) {
  return config.store_secret && std::getenv("TDIST_STORE_SECRET") == nullptr &&
         std::getenv("TDIST_STORE_SECRET_FILE") == nullptr;
}

// ---- LocalRendezvous ---------------------------------------------------------------

LocalRendezvous::LocalRendezvous(const LaunchConfig& config) : config_(config) {
  if (should_make_store_secret(config_)) secret_ = detail::random_hex(32);
}

RendezvousInfo LocalRendezvous::join(int round, int restarts) {
  RendezvousInfo info;
  info.round = round;
  info.restart_count = restarts;
  info.local_world_size = config_.nproc_per_node;
  info.world_size = config_.nproc_per_node;
  info.master_addr = config_.master_addr;
  // --standalone (and c10d, as torchrun) picks a fresh free port per attempt.
  bool pick = config_.standalone || config_.rdzv_backend == "c10d";
  info.master_port = pick && !config_.master_port_given ? detail::free_port(config_.master_addr)
                                                        : config_.master_port;
  info.store_secret = secret_;
  return info;
}

void LocalRendezvous::report_failure(int round, const std::string& summary) {
  if (failed_round_ == round) return;
  failed_round_ = round;
  failure_ = summary;
}

bool LocalRendezvous::failure_reported(int round) {
  return failed_round_ == round;
}

std::string LocalRendezvous::failure(int round) {
  return failed_round_ == round ? failure_ : "";
}

// ---- StoreRendezvous ---------------------------------------------------------------

StoreRendezvous::StoreRendezvous(StorePtr store, const LaunchConfig& config, bool is_host)
    : store_(std::move(store)),
      config_(config),
      is_host_(is_host),
      prefix_("tdistrun/" + config.rdzv_id + "/") {}

std::string StoreRendezvous::round_key(int round, const std::string& name) const {
  return prefix_ + "r" + std::to_string(round) + "/" + name;
}

void StoreRendezvous::wait_for(const std::vector<std::string>& keys, const std::string& what) {
  // Polled in small steps so that Ctrl-C is honoured while waiting for other nodes.
  auto deadline = Clock::now() + config_.join_timeout;
  while (!store_->check(keys)) {
    if (interrupted()) TDIST_THROW(Interrupted, "tdistrun: interrupted while waiting for " + what);
    if (!aborted().empty()) {
      TDIST_THROW(Interrupted, "tdistrun: another node aborted the job: " + aborted());
    }
    if (Clock::now() >= deadline) {
      TDIST_THROW(TimeoutError, "tdistrun: timed out after " +
                                    std::to_string(config_.join_timeout.count() / 1000.0) +
                                    " s waiting for " + what + " at the rendezvous " +
                                    config_.rdzv_host + ":" + std::to_string(config_.rdzv_port) +
                                    " (start tdistrun on every node with the same --rdzv-id and "
                                    "--nnodes, or raise --rdzv-conf join_timeout=SECONDS)");
    }
    std::this_thread::sleep_for(kPollStep);
  }
}

int StoreRendezvous::take_group_rank(int round) {
  if (config_.rendezvous_mode() == RendezvousMode::kStatic) {
    int g = config_.node_rank;
    std::string token =
        detail::host_name() + ":" + std::to_string(getpid()) + ":" + detail::random_hex(8);
    std::string owner =
        text(store_->compare_set(round_key(round, "claim/" + std::to_string(g)), {}, bytes(token)));
    if (owner != token) {
      TDIST_THROW(InvalidArgument, "tdistrun: node rank " + std::to_string(g) +
                                       " joined twice (already taken "
                                       "by launcher " +
                                       owner + "); give every node a distinct --node-rank in [0, " +
                                       std::to_string(config_.max_nodes) + ")");
    }
    return g;
  }
  if (is_host_) return 0;
  int g = static_cast<int>(store_->add(round_key(round, "next"), 1));
  if (g >= config_.max_nodes) {
    TDIST_THROW(InvalidArgument,
                "tdistrun: the rendezvous is full: " + std::to_string(config_.max_nodes) +
                    " nodes (--nnodes " + std::to_string(config_.min_nodes) + ":" +
                    std::to_string(config_.max_nodes) + ") already joined round " +
                    std::to_string(round));
  }
  return g;
}

int StoreRendezvous::close_round(int round, int restarts) {
  int nodes = config_.max_nodes;
  if (config_.rendezvous_mode() == RendezvousMode::kDynamic && config_.is_elastic()) {
    auto deadline = Clock::now() + config_.join_timeout;
    std::optional<Clock::time_point> min_reached;
    while (true) {
      int joined = 1 + static_cast<int>(store_->add(round_key(round, "next"), 0));
      if (joined >= config_.min_nodes && !min_reached) min_reached = Clock::now();
      if (joined >= config_.max_nodes ||
          (min_reached && Clock::now() - *min_reached >= config_.last_call_timeout)) {
        nodes = std::min(joined, config_.max_nodes);
        break;
      }
      if (interrupted()) TDIST_THROW(Interrupted, "tdistrun: interrupted in the rendezvous");
      if (Clock::now() >= deadline) {
        TDIST_THROW(TimeoutError, "tdistrun: only " + std::to_string(joined) + " of at least " +
                                      std::to_string(config_.min_nodes) + " nodes joined round " +
                                      std::to_string(round) + " within the join timeout");
      }
      std::this_thread::sleep_for(kPollStep);
    }
  }
  std::vector<std::string> node_keys;
  for (int g = 0; g < nodes; ++g)
    node_keys.push_back(round_key(round, "node/" + std::to_string(g)));
  wait_for(node_keys, std::to_string(nodes) + " nodes to join round " + std::to_string(round));

  std::string addr = config_.local_addr.empty() ? config_.rdzv_host : config_.local_addr;
  store_->set(round_key(round, "master"), addr + " " + std::to_string(detail::free_port(addr)));
  store_->set(round_key(round, "restarts"), std::to_string(restarts));
  if (round == 0 && should_make_store_secret(config_)) {
    store_->set(key("secret"), detail::random_hex(32));
  }
  store_->set(round_key(round, "closed"), std::to_string(nodes));
  return nodes;
}

bool StoreRendezvous::admits_late_nodes() const {
  return config_.rendezvous_mode() == RendezvousMode::kDynamic && config_.is_elastic();
}

int StoreRendezvous::current_round() {
  return store_->check({key("round")}) ? std::stoi(store_->get_string(key("round"))) : 0;
}

RendezvousInfo StoreRendezvous::join(int round, int restarts) {
  store_->set_timeout(config_.join_timeout);  // the round's keep-alives shortened it
  if (is_host_) store_->set(key("round"), std::to_string(round));
  // A node that starts while the job runs begins at the job's round, not at 0.
  if (!is_host_ && admits_late_nodes()) round = std::max(round, current_round());
  while (true) {
    int group_rank = take_group_rank(round);
    store_->set(round_key(round, "node/" + std::to_string(group_rank)),
                std::to_string(config_.nproc_per_node) + " " + detail::host_name());
    if (group_rank == 0) {
      close_round(round, restarts);
    } else {
      wait_for({round_key(round, "closed")}, "node 0 to close round " + std::to_string(round));
    }
    int nodes = std::stoi(store_->get_string(round_key(round, "closed")));
    if (group_rank < nodes) return round_info(round, group_rank);
    if (!admits_late_nodes()) {
      TDIST_THROW(InvalidArgument, "tdistrun: round " + std::to_string(round) + " closed with " +
                                       std::to_string(nodes) + " nodes before this node (rank " +
                                       std::to_string(group_rank) +
                                       ") joined; start it again to join the next round");
    }
    rendezvous_note("round " + std::to_string(round) + " already runs on " + std::to_string(nodes) +
                    " node(s); waiting for its nodes to restart their workers with this one");
    round = wait_for_next_round(round);
  }
}

int StoreRendezvous::wait_for_next_round(int round) {
  store_->add(round_key(round, "waiting"), 1);
  auto deadline = Clock::now() + config_.join_timeout;
  while (true) {
    int latest = current_round();
    if (latest > round) return latest;
    if (interrupted()) TDIST_THROW(Interrupted, "tdistrun: interrupted while waiting to join");
    if (!aborted().empty()) {
      TDIST_THROW(Interrupted, "tdistrun: another node aborted the job: " + aborted());
    }
    check_job_goes_on(round);
    if (Clock::now() >= deadline) {
      TDIST_THROW(TimeoutError, "tdistrun: the nodes of round " + std::to_string(round) +
                                    " did not restart to admit this node within the join "
                                    "timeout (raise --rdzv-conf join_timeout=SECONDS)");
    }
    std::this_thread::sleep_for(kPollStep);
  }
}

void StoreRendezvous::check_job_goes_on(int round) {
  const int nodes = std::stoi(store_->get_string(round_key(round, "closed")));
  if (store_->add(round_key(round, "done"), 0) >= nodes) {
    TDIST_THROW(Error, "tdistrun: the job finished (round " + std::to_string(round) +
                           " succeeded on its " + std::to_string(nodes) +
                           " node(s)) before this node could join");
  }
  // A failure ends the job when the round used the last restart (every node has the same
  // --max-restarts).
  const int restarts = std::stoi(store_->get_string(round_key(round, "restarts")));
  if (failure_reported(round) && !membership_changed(round) && restarts >= config_.max_restarts) {
    TDIST_THROW(Error,
                "tdistrun: the job failed in round " + std::to_string(round) +
                    " after its last restart, before this node could join: " + failure(round));
  }
}

StoreRendezvous::NodeEntry StoreRendezvous::node_entry(int round, int group_rank) {
  std::istringstream node(
      store_->get_string(round_key(round, "node/" + std::to_string(group_rank))));
  NodeEntry entry;
  node >> entry.nproc >> entry.host;
  return entry;
}

RendezvousInfo StoreRendezvous::round_info(int round, int group_rank) {
  RendezvousInfo info;
  info.round = round;
  info.group_rank = group_rank;
  const int nodes = std::stoi(store_->get_string(round_key(round, "closed")));
  nodes_in_round_ = nodes;
  info.group_world_size = nodes;
  info.world_size = 0;
  for (int g = 0; g < nodes; ++g) {
    const int nproc = node_entry(round, g).nproc;
    if (g < group_rank) info.rank_offset += nproc;
    info.world_size += nproc;
  }
  info.local_world_size = config_.nproc_per_node;
  info.restart_count = std::stoi(store_->get_string(round_key(round, "restarts")));
  std::istringstream master(store_->get_string(round_key(round, "master")));
  master >> info.master_addr >> info.master_port;
  if (should_make_store_secret(config_) && store_->check({key("secret")})) {
    info.store_secret = store_->get_string(key("secret"));
  }
  return info;
}

int StoreRendezvous::nodes_waiting(int round) {
  if (!admits_late_nodes()) return 0;
  return static_cast<int>(store_->add(round_key(round, "waiting"), 0));
}

void StoreRendezvous::request_rejoin(int round, const std::string& reason) {
  store_->compare_set(round_key(round, "failure"), {}, bytes(kMembershipChange + reason));
}

void StoreRendezvous::report_failure(int round, const std::string& summary) {
  store_->compare_set(round_key(round, "failure"), {}, bytes(summary));
}

bool StoreRendezvous::failure_reported(int round) {
  return store_->check({round_key(round, "failure")}) || store_->check({key("abort")});
}

std::string StoreRendezvous::failure(int round) {
  if (!store_->check({round_key(round, "failure")})) return "";
  return store_->get_string(round_key(round, "failure"));
}

void StoreRendezvous::report_success(int round) {
  store_->add(round_key(round, "done"), 1);
}

bool StoreRendezvous::all_succeeded(int round) {
  return store_->add(round_key(round, "done"), 0) >= nodes_in_round_;
}

void StoreRendezvous::abort(const std::string& reason) {
  store_->compare_set(key("abort"), {}, bytes(reason));
}

std::string StoreRendezvous::aborted() {
  if (!store_->check({key("abort")})) return "";
  return store_->get_string(key("abort"));
}

void StoreRendezvous::shutdown(bool quick) {
  int64_t finished = store_->add(key("exit"), 1);
  if (!is_host_) return;
  // Keep the store up until every node has read the outcome.
  auto deadline = Clock::now() + (quick ? std::min(config_.exit_barrier_timeout, milliseconds(2000))
                                        : config_.exit_barrier_timeout);
  while (finished < std::max(nodes_in_round_, 1) && Clock::now() < deadline) {
    std::this_thread::sleep_for(kPollStep);
    finished = store_->add(key("exit"), 0);
  }
}

// ---- Note [Agent keep-alives] ----------------------------------------------------------

KeepAliveProblem StoreRendezvous::keep_alive(const RendezvousInfo& info) {
  const auto now = Clock::now();
  if (watch_.round == info.round && now - watch_.last_beat < config_.keep_alive_interval) {
    return {};
  }
  if (watch_.round != info.round) {
    // While the round runs, no request waits longer than a silent node is given: the store's
    // host vanishing shows as unanswered requests within the same time (join restores it).
    store_->set_timeout(config_.keep_alive_window());
  }
  watch_.last_beat = now;
  try {
    store_->add(round_key(info.round, "alive/" + std::to_string(info.group_rank)), 1);
    return check_peers(info);
  } catch (const std::exception& e) {
    return lost_store(e.what());
  }
}

KeepAliveProblem StoreRendezvous::lost_store(const std::string& error) {
  const auto window = config_.keep_alive_window();
  KeepAliveProblem problem;
  problem.store_lost = true;
  problem.what = "the rendezvous store at " + config_.rdzv_host + ":" +
                 std::to_string(config_.rdzv_port) + " did not answer within " +
                 seconds_text(window) + " (" + std::to_string(config_.keep_alive_max_attempt) +
                 " keep-alive intervals of " + seconds_text(config_.keep_alive_interval) +
                 ", --rdzv-conf keep_alive_interval / keep_alive_max_attempt): the launcher "
                 "hosting it stopped, or its host vanished or lost its network (" +
                 error + ")";
  return problem;
}

KeepAliveProblem StoreRendezvous::check_peers(const RendezvousInfo& info) {
  const auto now = Clock::now();
  const auto nodes = static_cast<size_t>(info.group_world_size);
  if (watch_.round != info.round) {
    watch_.round = info.round;
    watch_.counts.assign(nodes, -1);
    watch_.moved.assign(nodes, now);
  }
  const auto window = config_.keep_alive_window();
  for (size_t g = 0; g < nodes; ++g) {
    if (static_cast<int>(g) == info.group_rank) continue;
    const int64_t count = store_->add(round_key(info.round, "alive/" + std::to_string(g)), 0);
    if (count != watch_.counts[g]) {
      watch_.counts[g] = count;
      watch_.moved[g] = now;
      continue;
    }
    if (now - watch_.moved[g] < window) continue;
    KeepAliveProblem problem;
    problem.what =
        "node " + std::to_string(g) + " (host " + node_entry(info.round, g).host +
        ") sent no keep-alive for " +
        seconds_text(std::chrono::duration_cast<milliseconds>(now - watch_.moved[g])) + " (" +
        std::to_string(config_.keep_alive_max_attempt) + " intervals of " +
        seconds_text(config_.keep_alive_interval) +
        ", --rdzv-conf keep_alive_interval / keep_alive_max_attempt): its launcher stopped, or "
        "its host vanished or lost its network; noticed by node " +
        std::to_string(info.group_rank) + " (" + detail::host_name() + ")";
    return problem;
  }
  return {};
}

}  // namespace tdist::launch

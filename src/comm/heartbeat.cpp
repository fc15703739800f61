// HeartbeatMonitor: Note [Heartbeats] in heartbeat.h.

#include "comm/heartbeat.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "tdist/error.h"

namespace tdist::detail {
namespace {

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string this_process() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return std::string("host ") + host + ", pid " + std::to_string(::getpid());
}

std::string seconds_text(std::chrono::milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", ms.count() / 1000.0);
  return text;
}

}  // namespace

HeartbeatMonitor::HeartbeatMonitor(StorePtr store, std::string prefix, int rank, int world_size,
                                   HeartbeatOptions options, LostHandler on_lost)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      rank_(rank),
      world_size_(world_size),
      options_(options),
      on_lost_(std::move(on_lost)),
      watched_(world_size > 1 ? (rank + 1) % world_size : rank),
      last_change_(std::chrono::steady_clock::now()) {
  store_->set(key("process/" + std::to_string(rank_)), bytes(this_process()));
  store_->add(key("beat/" + std::to_string(rank_)), 1);
  thread_ = std::thread([this] { run(); });
}

HeartbeatMonitor::~HeartbeatMonitor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  try {
    store_->set(key("done/" + std::to_string(rank_)), bytes("1"));
  } catch (const std::exception&) {
    // The store is gone: nobody is left to watch this rank.
  }
}

void HeartbeatMonitor::end_process(const std::string& message) {
  std::cerr << "tdist: error: " << message << "; ending this process (exit code "
            << kHeartbeatLostExitCode
            << ") so that its launcher can restart the job from its newest checkpoint" << std::endl;
  std::fflush(nullptr);  // what the training loop printed so far (std::cout is synced to stdio)
  std::_Exit(kHeartbeatLostExitCode);
}

void HeartbeatMonitor::handle_loss(const std::string& message) {
  const auto grace = options_.effective_grace();
  std::cerr << "tdist: error: " << message
            << "; interrupting this rank's collectives, which raise this error; the process "
               "ends in "
            << seconds_text(grace)
            << " unless it calls destroy_process_group first (TDIST_HEARTBEAT_GRACE_MS)"
            << std::endl;
  if (!on_lost_(message)) {
    end_process(message +
                " (a backend of this rank cannot interrupt an operation waiting on "
                "it, so the error cannot be raised)");
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (stop_cv_.wait_for(lock, grace, [this] { return stopping_; })) return;
  lock.unlock();
  end_process(message + "; this process was still running " + seconds_text(grace) +
              " after its collectives were interrupted (TDIST_HEARTBEAT_GRACE_MS)");
}

std::string HeartbeatMonitor::key(const std::string& what) const {
  return prefix_ + "heartbeat/" + what;
}

void HeartbeatMonitor::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    Outcome outcome = Outcome::kStop;
    try {
      outcome = beat_and_watch();
    } catch (const TimeoutError&) {
      // The store did not answer for a whole silence: rank 0, which hosts it, is gone.
      lock.lock();
      if (stopping_) return;
      lock.unlock();
      handle_loss("rank 0, which hosts the store, stopped answering for " +
                  seconds_text(options_.silence()) + " (" + std::to_string(options_.misses) +
                  " heartbeat intervals of " + std::to_string(options_.interval.count()) +
                  " ms): its node or process vanished; noticed by rank " + std::to_string(rank_));
      return;
    } catch (const std::exception&) {
      return;  // the store's process ended (connection refused or reset): its exit is reported
    }
    if (outcome == Outcome::kLost) {
      handle_loss(lost_message_);
      return;
    }
    lock.lock();
    if (outcome == Outcome::kStop) return;
    stop_cv_.wait_for(lock, options_.interval, [this] { return stopping_; });
  }
}

bool HeartbeatMonitor::peer_finished(int peer) {
  return store_->check({key("done/" + std::to_string(peer))});
}

std::string HeartbeatMonitor::describe(int peer, std::chrono::milliseconds silent) {
  std::string where;
  const std::string process_key = key("process/" + std::to_string(peer));
  if (store_->check({process_key})) {
    const auto value = store_->get(process_key);
    where = " (" + std::string(value.begin(), value.end()) + ")";
  }
  return "rank " + std::to_string(peer) + where + " has not sent a heartbeat for " +
         seconds_text(silent) + " (" + std::to_string(options_.misses) + " intervals of " +
         std::to_string(options_.interval.count()) +
         " ms, TDIST_HEARTBEAT_INTERVAL_MS / TDIST_HEARTBEAT_MISSES): its node or process "
         "vanished or stopped; noticed by rank " +
         std::to_string(rank_);
}

HeartbeatMonitor::Outcome HeartbeatMonitor::beat_and_watch() {
  store_->add(key("beat/" + std::to_string(rank_)), 1);
  const std::string lost_key = key("lost");
  if (store_->check({lost_key})) {
    const auto value = store_->get(lost_key);
    lost_message_.assign(value.begin(), value.end());
    return Outcome::kLost;
  }
  const auto now = std::chrono::steady_clock::now();
  while (watched_ != rank_) {
    const int64_t count = store_->add(key("beat/" + std::to_string(watched_)), 0);
    if (count != last_count_) {
      last_count_ = count;
      last_change_ = now;
      return Outcome::kGoOn;
    }
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_change_);
    if (silent < options_.silence()) return Outcome::kGoOn;
    if (!peer_finished(watched_)) {
      const std::string message = describe(watched_, silent);
      store_->compare_set(lost_key, {}, bytes(message));
      const auto value = store_->get(lost_key);  // the first declaration wins everywhere
      lost_message_.assign(value.begin(), value.end());
      return Outcome::kLost;
    }
    // It finished: watch the next one (its counter is read on the next pass of this loop).
    watched_ = (watched_ + 1) % world_size_;
    last_count_ = -1;
    last_change_ = now;
  }
  return Outcome::kGoOn;
}

}  // namespace tdist::detail

#pragma once

// In-memory store for ranks that are threads of one process (tests, single-process runs).

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "tdist/store/store.h"

namespace tdist {

class HashStore : public Store {
 public:
  explicit HashStore(std::chrono::milliseconds timeout = kDefaultTimeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::vector<uint8_t>>& values) override;
  void queue_push(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> queue_pop(const std::string& key, bool block,
                                 std::chrono::milliseconds timeout) override;
  int64_t queue_len(const std::string& key) override;
  using Store::append;
  using Store::multi_set;
  using Store::queue_pop;
  using Store::queue_push;
  using Store::set;
  using Store::wait;

 private:
  /// True when the key has a value or a non-empty queue (what check and wait look for).
  bool present_locked(const std::string& key) const;
  /// Waits up to the store's timeout for every key's value (queues do not count).
  std::vector<std::vector<uint8_t>> values_of(const char* op, const std::vector<std::string>& keys);
  /// Waits under `lock` until ready() or the timeout; false on timeout.
  template <typename Ready>
  bool wait_locked(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout,
                   Ready ready);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<uint8_t>> data_;
  // Non-empty queues only: a queue popped empty is erased, so check/wait see it as absent.
  std::map<std::string, std::deque<std::vector<uint8_t>>> queues_;
};

}  // namespace tdist

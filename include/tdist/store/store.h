#pragma once

// Key-value store used for rendezvous: the same contract as c10d's Store, with its extended
// API (append, multi_get, multi_set) and its queues.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tdist {

/// A distributed key-value store shared by all ranks of a job.
/// Values are byte strings. Every blocking call honours the store's timeout.
class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(5)};
  static constexpr std::chrono::milliseconds kNoTimeout{0};

  explicit Store(std::chrono::milliseconds timeout = kDefaultTimeout) : timeout_(timeout) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  /// Blocks until the key exists (or the timeout passes), then returns its value.
  virtual std::vector<uint8_t> get(const std::string& key) = 0;
  /// Adds `value` to the integer stored at key (0 if absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t value) = 0;
  /// Sets key to desired if its current value equals expected (an absent key matches an
  /// empty expected); returns the value after the call.
  virtual std::vector<uint8_t> compare_set(const std::string& key,
                                           const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired) = 0;
  /// True when every key exists; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  /// Returns true if the key existed.
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;
  /// Blocks until every key exists; throws TimeoutError naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  // c10d's extended API. The base bodies are built from the ops above (append by a
  // compare_set loop, multi_get by wait then get, multi_set by one set per key); every tdist
  // store overrides them with one atomic step.

  /// Appends value to the bytes stored at key; creates the key if it is missing.
  virtual void append(const std::string& key, const std::vector<uint8_t>& value);
  /// Blocks until every key exists (or the store's timeout passes, TimeoutError naming the
  /// missing keys), then returns their values in the order of keys.
  virtual std::vector<std::vector<uint8_t>> multi_get(const std::vector<std::string>& keys);
  /// Sets keys[i] to values[i] for every i, as one step where the store allows; keys and
  /// values of different lengths are refused (InvalidArgument naming both lengths).
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::vector<uint8_t>>& values);
  /// True: append, multi_get and multi_set are served by the store itself (c10d's
  /// hasExtendedApi).
  virtual bool has_extended_api() const { return true; }

  // Queues (c10d's queue_push / queue_pop / queue_len). A queue lives beside the keys: pushing
  // to "q" does not set the key "q", get and delete_key do not see it and num_keys does not
  // count it, but check and wait count a key as present while its queue is non-empty (as
  // c10d's TCPStore does). The base bodies throw StoreError: a store without queues says so.

  /// Appends value to the back of the queue named key (created if missing).
  virtual void queue_push(const std::string& key, const std::vector<uint8_t>& value);
  /// Removes and returns the front of the queue. block: wait up to `timeout` (kNoTimeout: no
  /// limit) for an item, then throw TimeoutError naming the key and the timeout; not block:
  /// throw QueueEmptyError at once when the queue is empty.
  virtual std::vector<uint8_t> queue_pop(const std::string& key, bool block,
                                         std::chrono::milliseconds timeout);
  /// queue_pop with the store's timeout.
  std::vector<uint8_t> queue_pop(const std::string& key, bool block = true) {
    return queue_pop(key, block, timeout_);
  }
  /// Items in the queue; 0 when it does not exist.
  virtual int64_t queue_len(const std::string& key);

  // String conveniences.
  void set(const std::string& key, const std::string& value) {
    set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get_string(const std::string& key) {
    auto v = get(key);
    return std::string(v.begin(), v.end());
  }
  void append(const std::string& key, const std::string& value) {
    append(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  void queue_push(const std::string& key, const std::string& value) {
    queue_push(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 protected:
  /// Throws InvalidArgument naming both lengths unless keys and values pair up; `op` names
  /// the caller ("TCPStore::multi_set").
  static void check_multi_set_args(const char* op, const std::vector<std::string>& keys,
                                   const std::vector<std::vector<uint8_t>>& values);

  std::chrono::milliseconds timeout_;
};

using StorePtr = std::shared_ptr<Store>;

}  // namespace tdist

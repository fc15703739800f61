#pragma once

// Key-value store used for rendezvous: the same contract as c10d's Store.

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

  // String conveniences.
  void set(const std::string& key, const std::string& value) {
    set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get_string(const std::string& key) {
    auto v = get(key);
    return std::string(v.begin(), v.end());
  }

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 protected:
  std::chrono::milliseconds timeout_;
};

using StorePtr = std::shared_ptr<Store>;

}  // namespace tdist

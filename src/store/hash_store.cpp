#include "tdist/store/hash_store.h"

#include "tdist/error.h"

namespace tdist {

HashStore::HashStore(std::chrono::milliseconds timeout) : Store(timeout) {}

void HashStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

template <typename Ready>
bool HashStore::wait_locked(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout,
                            Ready ready) {
  if (timeout.count() <= 0) {
    changed_.wait(lock, ready);
    return true;
  }
  return changed_.wait_for(lock, timeout, ready);
}

bool HashStore::present_locked(const std::string& key) const {
  return data_.count(key) > 0 || queues_.count(key) > 0;
}

std::vector<uint8_t> HashStore::get(const std::string& key) {
  // A value, not a queue of the same name, releases a get.
  return values_of("HashStore::get", {key}).front();
}

int64_t HashStore::add(const std::string& key, int64_t value) {
  int64_t result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    int64_t current = 0;
    if (it != data_.end()) current = std::stoll(std::string(it->second.begin(), it->second.end()));
    result = current + value;
    auto text = std::to_string(result);
    data_[key] = std::vector<uint8_t>(text.begin(), text.end());
  }
  changed_.notify_all();
  return result;
}

std::vector<uint8_t> HashStore::compare_set(const std::string& key,
                                            const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired) {
  std::vector<uint8_t> result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = data_.find(key);
    if ((it == data_.end() && expected.empty()) || (it != data_.end() && it->second == expected)) {
      data_[key] = desired;
      result = desired;
    } else {
      result = it == data_.end() ? expected : it->second;
    }
  }
  changed_.notify_all();
  return result;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& key : keys) {
    if (!present_locked(key)) return false;
  }
  return true;
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(data_.size());
}

void HashStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_present = [&] {
    for (const auto& key : keys) {
      if (!present_locked(key)) return false;
    }
    return true;
  };
  if (!wait_locked(lock, timeout, all_present)) {
    std::string missing;
    for (const auto& key : keys) {
      if (!present_locked(key)) missing += (missing.empty() ? "" : ", ") + key;
    }
    TDIST_THROW(TimeoutError, "HashStore::wait: keys [" + missing + "] not set within " +
                                  std::to_string(timeout.count()) + " ms");
  }
}

void HashStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& current = data_[key];
    current.insert(current.end(), value.begin(), value.end());
  }
  changed_.notify_all();
}

std::vector<std::vector<uint8_t>> HashStore::multi_get(const std::vector<std::string>& keys) {
  return values_of("HashStore::multi_get", keys);
}

std::vector<std::vector<uint8_t>> HashStore::values_of(const char* op,
                                                       const std::vector<std::string>& keys) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_set = [&] {
    for (const auto& key : keys) {
      if (data_.count(key) == 0) return false;
    }
    return true;
  };
  if (!wait_locked(lock, timeout_, all_set)) {
    std::string missing;
    for (const auto& key : keys) {
      if (data_.count(key) == 0) missing += (missing.empty() ? "" : ", ") + key;
    }
    TDIST_THROW(TimeoutError, std::string(op) + ": keys [" + missing + "] not set within " +
                                  std::to_string(timeout_.count()) + " ms");
  }
  std::vector<std::vector<uint8_t>> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(data_.at(key));
  return values;
}

void HashStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::vector<uint8_t>>& values) {
  check_multi_set_args("HashStore::multi_set", keys, values);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

void HashStore::queue_push(const std::string& key, const std::vector<uint8_t>& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queues_[key].push_back(value);
  }
  changed_.notify_all();
}

std::vector<uint8_t> HashStore::queue_pop(const std::string& key, bool block,
                                          std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto has_item = [&] { return queues_.count(key) > 0; };
  if (!has_item()) {
    if (!block) TDIST_THROW(QueueEmptyError, "HashStore::queue_pop: queue '" + key + "' is empty");
    if (!wait_locked(lock, timeout, has_item)) {
      TDIST_THROW(TimeoutError, "HashStore::queue_pop: queue '" + key + "' stayed empty for " +
                                    std::to_string(timeout.count()) +
                                    " ms; nothing was pushed to it in time (a rank that should "
                                    "push may be missing or slow, or every item was popped)");
    }
  }
  auto it = queues_.find(key);
  std::vector<uint8_t> value = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return value;
}

int64_t HashStore::queue_len(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

}  // namespace tdist

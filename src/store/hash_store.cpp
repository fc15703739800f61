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

std::vector<uint8_t> HashStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard<std::mutex> lock(mutex_);
  return data_.at(key);
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
    if (data_.count(key) == 0) return false;
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
      if (data_.count(key) == 0) return false;
    }
    return true;
  };
  if (timeout.count() <= 0) {
    changed_.wait(lock, all_present);
    return;
  }
  if (!changed_.wait_for(lock, timeout, all_present)) {
    std::string missing;
    for (const auto& key : keys) {
      if (data_.count(key) == 0) missing += (missing.empty() ? "" : ", ") + key;
    }
    TDIST_THROW(TimeoutError, "HashStore::wait: keys [" + missing + "] not set within " +
                                  std::to_string(timeout.count()) + " ms");
  }
}

}  // namespace tdist

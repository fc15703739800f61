#include "tdist/store/store.h"

#include "tdist/error.h"

namespace tdist {

void Store::check_multi_set_args(const char* op, const std::vector<std::string>& keys,
                                 const std::vector<std::vector<uint8_t>>& values) {
  TDIST_CHECK_ARG(keys.size() == values.size(),
                  std::string(op) + ": " + std::to_string(keys.size()) + " keys but " +
                      std::to_string(values.size()) +
                      " values; pass one value per key (keys[i] is set to values[i])");
}

void Store::multi_set(const std::vector<std::string>& keys,
                      const std::vector<std::string>& values) {
  std::vector<std::vector<uint8_t>> bytes;
  bytes.reserve(values.size());
  for (const auto& v : values) bytes.emplace_back(v.begin(), v.end());
  multi_set(keys, bytes);
}

void Store::append(const std::string& key, const std::vector<uint8_t>& value) {
  // compare_set treats an absent key as an empty expected value, so the first round creates
  // the key; a lost race retries with the value the winner left.
  std::vector<uint8_t> current;
  if (check({key})) current = get(key);
  while (true) {
    std::vector<uint8_t> desired = current;
    desired.insert(desired.end(), value.begin(), value.end());
    auto now = compare_set(key, current, desired);
    if (now == desired) return;
    // A failed compare_set returns the value it found, or `expected` itself when the key is
    // gone (deleted meanwhile): start again from an absent key then.
    current = now == current ? std::vector<uint8_t>{} : std::move(now);
  }
}

std::vector<std::vector<uint8_t>> Store::multi_get(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
  std::vector<std::vector<uint8_t>> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(get(key));
  return values;
}

void Store::multi_set(const std::vector<std::string>& keys,
                      const std::vector<std::vector<uint8_t>>& values) {
  check_multi_set_args("Store::multi_set", keys, values);
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

void Store::queue_push(const std::string& key, const std::vector<uint8_t>&) {
  TDIST_THROW(StoreError, "Store::queue_push('" + key +
                              "'): this store has no queues; use a TCPStore, HashStore, "
                              "FileStore or a PrefixStore over one of them");
}

std::vector<uint8_t> Store::queue_pop(const std::string& key, bool, std::chrono::milliseconds) {
  TDIST_THROW(StoreError, "Store::queue_pop('" + key +
                              "'): this store has no queues; use a TCPStore, HashStore, "
                              "FileStore or a PrefixStore over one of them");
}

int64_t Store::queue_len(const std::string& key) {
  TDIST_THROW(StoreError, "Store::queue_len('" + key +
                              "'): this store has no queues; use a TCPStore, HashStore, "
                              "FileStore or a PrefixStore over one of them");
}

}  // namespace tdist

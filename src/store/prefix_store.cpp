#include "tdist/store/prefix_store.h"

#include "tdist/error.h"

namespace tdist {

PrefixStore::PrefixStore(std::string prefix, StorePtr store)
    : Store(store ? store->timeout() : kDefaultTimeout),
      prefix_(std::move(prefix)),
      store_(std::move(store)) {
  TDIST_CHECK_ARG(store_ != nullptr, "PrefixStore: the underlying store is null");
}

std::string PrefixStore::prefixed(const std::string& key) const {
  return prefix_ + "/" + key;
}

std::vector<std::string> PrefixStore::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& key : keys) full.push_back(prefixed(key));
  return full;
}

void PrefixStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  store_->set(prefixed(key), value);
}
std::vector<uint8_t> PrefixStore::get(const std::string& key) {
  // Honour this store's timeout, not the underlying one's.
  store_->wait({prefixed(key)}, timeout_);
  return store_->get(prefixed(key));
}
int64_t PrefixStore::add(const std::string& key, int64_t value) {
  return store_->add(prefixed(key), value);
}
std::vector<uint8_t> PrefixStore::compare_set(const std::string& key,
                                              const std::vector<uint8_t>& expected,
                                              const std::vector<uint8_t>& desired) {
  return store_->compare_set(prefixed(key), expected, desired);
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  return store_->check(prefixed(keys));
}
bool PrefixStore::delete_key(const std::string& key) {
  return store_->delete_key(prefixed(key));
}
int64_t PrefixStore::num_keys() {
  return store_->num_keys();
}
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  store_->wait(prefixed(keys), timeout);
}
void PrefixStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  store_->append(prefixed(key), value);
}
std::vector<std::vector<uint8_t>> PrefixStore::multi_get(const std::vector<std::string>& keys) {
  const auto full = prefixed(keys);
  // This store's timeout, as get.
  store_->wait(full, timeout_);
  return store_->multi_get(full);
}
void PrefixStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<std::vector<uint8_t>>& values) {
  check_multi_set_args("PrefixStore::multi_set", keys, values);
  store_->multi_set(prefixed(keys), values);
}
void PrefixStore::queue_push(const std::string& key, const std::vector<uint8_t>& value) {
  store_->queue_push(prefixed(key), value);
}
std::vector<uint8_t> PrefixStore::queue_pop(const std::string& key, bool block,
                                            std::chrono::milliseconds timeout) {
  return store_->queue_pop(prefixed(key), block, timeout);
}
int64_t PrefixStore::queue_len(const std::string& key) {
  return store_->queue_len(prefixed(key));
}

}  // namespace tdist

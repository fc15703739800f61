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
  std::vector<std::string> full;
  for (const auto& key : keys) full.push_back(prefixed(key));
  return store_->check(full);
}
bool PrefixStore::delete_key(const std::string& key) {
  return store_->delete_key(prefixed(key));
}
int64_t PrefixStore::num_keys() {
  return store_->num_keys();
}
void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full;
  for (const auto& key : keys) full.push_back(prefixed(key));
  store_->wait(full, timeout);
}

}  // namespace tdist

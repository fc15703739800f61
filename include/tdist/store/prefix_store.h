#pragma once

// Namespaces every key of an underlying store with "<prefix>/", so groups never collide.

#include "tdist/store/store.h"

namespace tdist {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, StorePtr store);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::set;
  using Store::wait;

  const StorePtr& underlying_store() const { return store_; }

 private:
  std::string prefixed(const std::string& key) const;
  std::string prefix_;
  StorePtr store_;
};

}  // namespace tdist

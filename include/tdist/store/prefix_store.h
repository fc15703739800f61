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

  const StorePtr& underlying_store() const { return store_; }

 private:
  std::string prefixed(const std::string& key) const;
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;
  std::string prefix_;
  StorePtr store_;
};

}  // namespace tdist

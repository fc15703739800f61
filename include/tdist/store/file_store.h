#pragma once

// A store kept in one file on a file system every process shares (fcntl-locked appends).
// Used by file:// init. The file must be new or empty when the first process opens it for a
// job of `num_workers`; a stale file from an earlier run is reported, never waited on.

#include <memory>
#include <string>

#include "tdist/store/store.h"

namespace tdist {

namespace detail {
struct FileStoreState;
}  // namespace detail

class FileStore : public Store {
 public:
  /// num_workers < 0: unknown (no stale-file check, no cleanup by the last worker).
  FileStore(std::string path, int num_workers, std::chrono::milliseconds timeout = kDefaultTimeout);
  ~FileStore() override;

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

  const std::string& path() const { return path_; }

 private:
  /// Waits up to the store's timeout for every key's value (queues do not count).
  std::vector<std::vector<uint8_t>> values_of(const char* op, const std::vector<std::string>& keys);
  std::string path_;
  int num_workers_;
  std::unique_ptr<detail::FileStoreState> state_;
};

}  // namespace tdist

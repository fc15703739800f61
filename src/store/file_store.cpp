#include "tdist/store/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <iostream>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "store/reserved_keys.h"
#include "store/tcp_store_protocol.h"
#include "tdist/error.h"

namespace tdist {

// Note [FileStore format]
// The file is an append-only log: an 8-byte magic, then records
//   u8 kind (1 set, 2 delete, 3 queue push, 4 queue pop) | u32 key length | key |
//   u64 value length | value (empty for delete and queue pop).
// Writers append under an exclusive lock; readers replay new records under a shared lock.
// Locks are fcntl open-file-description locks (F_OFD_SETLK), so two FileStores in one
// process (ranks as threads) exclude each other too; a mutex covers threads sharing one
// FileStore. Locks are taken with a non-blocking call retried until the timeout: never a hang.
// Two reserved counters track workers joined and left; the stale-file check and the cleanup
// by the last worker are built on them (see the constructor and destructor).

namespace {

constexpr char kMagic[8] = {'T', 'D', 'I', 'S', 'T', 'F', 'S', '1'};
constexpr uint8_t kSetRecord = 1;
constexpr uint8_t kDeleteRecord = 2;
constexpr uint8_t kQueuePushRecord = 3;
constexpr uint8_t kQueuePopRecord = 4;
const std::string kJoinedKey = detail::kReservedKeyPrefix + "joined";
const std::string kLeftKey = detail::kReservedKeyPrefix + "left";

using Clock = std::chrono::steady_clock;

// Absurd timeouts mean "none", never an overflowed clock.
Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  constexpr auto kForever = std::chrono::hours(24 * 365 * 10);
  if (timeout.count() <= 0 || timeout > kForever) return Clock::time_point::max();
  return Clock::now() + timeout;
}

std::string errno_text() {
  return std::strerror(errno);
}

std::vector<uint8_t> bytes_of(const std::string& s) {
  return {s.begin(), s.end()};
}

}  // namespace

namespace detail {
struct FileStoreState {
  int fd = -1;
  std::mutex mutex;  // threads sharing this FileStore
  std::unordered_map<std::string, std::vector<uint8_t>> data;
  // Non-empty queues only (a queue popped empty is erased), beside the keys.
  std::unordered_map<std::string, std::deque<std::vector<uint8_t>>> queues;
  uint64_t offset = 0;  // bytes of the log already replayed into `data`
  size_t reserved = 0;

  ~FileStoreState() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace detail

namespace {

using State = detail::FileStoreState;

// Holds an fcntl lock on the whole file for its lifetime.
class FileLock {
 public:
  FileLock(int fd, bool exclusive, std::chrono::milliseconds timeout, const std::string& path)
      : fd_(fd) {
    const auto deadline = deadline_after(timeout);
    auto backoff = std::chrono::microseconds(200);
    while (true) {
      struct flock fl {};
      fl.l_type = exclusive ? F_WRLCK : F_RDLCK;
      fl.l_whence = SEEK_SET;
      int rc = ::fcntl(fd_, use_ofd_ ? F_OFD_SETLK : F_SETLK, &fl);
      if (rc == 0) return;
      if (errno == EINVAL && use_ofd_) {
        use_ofd_ = false;  // kernel without OFD locks: per-process locks (threads via mutex)
        continue;
      }
      if (errno != EACCES && errno != EAGAIN && errno != EINTR) {
        TDIST_THROW(StoreError, "FileStore: cannot lock '" + path + "': " + errno_text() +
                                    "; the file system must support fcntl locks");
      }
      if (Clock::now() >= deadline) {
        TDIST_THROW(TimeoutError, "FileStore: could not lock '" + path + "' within " +
                                      std::to_string(timeout.count()) +
                                      " ms; another process holds it (is it stopped?)");
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(10000));
    }
  }
  ~FileLock() {
    struct flock fl {};
    fl.l_type = F_UNLCK;
    fl.l_whence = SEEK_SET;
    ::fcntl(fd_, use_ofd_ ? F_OFD_SETLK : F_SETLK, &fl);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
  bool use_ofd_ = true;
};

void read_exact(int fd, uint64_t offset, uint8_t* out, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      TDIST_THROW(StoreError, "FileStore: cannot read '" + path + "': " +
                                  (n == 0 ? std::string("unexpected end of file") : errno_text()));
    }
    out += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

void write_all(int fd, const std::vector<uint8_t>& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) TDIST_THROW(StoreError, "FileStore: cannot write '" + path + "': " + errno_text());
    done += static_cast<size_t>(n);
  }
}

[[noreturn]] void corrupt(const std::string& path, const std::string& why) {
  TDIST_THROW(StoreError, "FileStore: '" + path + "' is not a valid store file (" + why +
                              "); delete it or use a new path, then restart every rank");
}

// Applies one record to the cache; false for a record the cache cannot take (a pop of an
// empty queue).
bool apply(State& s, uint8_t kind, const std::string& key, std::vector<uint8_t> value) {
  const bool reserved = detail::is_reserved_key(key);
  switch (kind) {
    case kSetRecord: {
      auto [it, inserted] = s.data.insert_or_assign(key, std::move(value));
      if (inserted && reserved) ++s.reserved;
      return true;
    }
    case kDeleteRecord:
      if (s.data.erase(key) > 0 && reserved) --s.reserved;
      return true;
    case kQueuePushRecord:
      s.queues[key].push_back(std::move(value));
      return true;
    case kQueuePopRecord: {
      auto it = s.queues.find(key);
      if (it == s.queues.end()) return false;
      it->second.pop_front();
      if (it->second.empty()) s.queues.erase(it);
      return true;
    }
  }
  return false;
}

// Brings the cache up to date with the file. Call under a lock.
void refresh(State& s, const std::string& path) {
  struct stat st {};
  if (::fstat(s.fd, &st) != 0) TDIST_THROW(StoreError, "FileStore: stat '" + path + "' failed");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < s.offset) corrupt(path, "it shrank while in use");
  if (s.offset == 0 && size > 0) {
    if (size < sizeof(kMagic)) corrupt(path, "too short");
    uint8_t magic[sizeof(kMagic)];
    read_exact(s.fd, 0, magic, sizeof(magic), path);
    if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) corrupt(path, "bad magic");
    s.offset = sizeof(kMagic);
  }
  if (size == s.offset) return;
  std::vector<uint8_t> log(size - s.offset);
  read_exact(s.fd, s.offset, log.data(), log.size(), path);
  size_t pos = 0;
  while (pos < log.size()) {
    if (log.size() - pos < 5) corrupt(path, "truncated record");
    const uint8_t kind = log[pos];
    const uint32_t key_len = detail::store_proto::get_u32(&log[pos + 1]);
    pos += 5;
    if (kind < kSetRecord || kind > kQueuePopRecord) corrupt(path, "unknown record");
    if (log.size() - pos < static_cast<uint64_t>(key_len) + 8) corrupt(path, "truncated key");
    std::string key(reinterpret_cast<const char*>(&log[pos]), key_len);
    pos += key_len;
    const uint64_t value_len = detail::store_proto::get_u64(&log[pos]);
    pos += 8;
    if (log.size() - pos < value_len) corrupt(path, "truncated value");
    if (!apply(s, kind, key, std::vector<uint8_t>(&log[pos], &log[pos] + value_len))) {
      corrupt(path, "a pop of the empty queue '" + key + "'");
    }
    pos += value_len;
  }
  s.offset = size;
}

// Appends one record (and the magic for a new file). Call under the exclusive lock after
// refresh(), so the file ends where the cache does.
void append_record(State& s, const std::string& path, uint8_t kind, const std::string& key,
                   const std::vector<uint8_t>& value) {
  std::vector<uint8_t> bytes;
  if (s.offset == 0) bytes.assign(kMagic, kMagic + sizeof(kMagic));
  bytes.push_back(kind);
  detail::store_proto::put_u32(static_cast<uint32_t>(key.size()), &bytes);
  bytes.insert(bytes.end(), key.begin(), key.end());
  detail::store_proto::put_u64(value.size(), &bytes);
  bytes.insert(bytes.end(), value.begin(), value.end());
  write_all(s.fd, bytes, path);
  s.offset += bytes.size();
  apply(s, kind, key, value);
}

bool present(const State& s, const std::string& key) {
  return s.data.count(key) > 0 || s.queues.count(key) > 0;
}

// Note [FileStore polling]
// A file has no change notification that works on every shared file system: blocking calls
// poll it, backing off from 1 to 20 ms. `attempt` runs under the mutex and a lock (exclusive
// when it may write) on a refreshed cache and returns true when done; poll returns false
// when `timeout` (<= 0: none) passed first.
template <typename Attempt>
bool poll(State& s, const std::string& path, bool exclusive, std::chrono::milliseconds lock_timeout,
          std::chrono::milliseconds timeout, Attempt attempt) {
  const auto deadline = deadline_after(timeout);
  auto backoff = std::chrono::milliseconds(1);
  while (true) {
    {
      std::lock_guard<std::mutex> guard(s.mutex);
      FileLock lock(s.fd, exclusive, lock_timeout, path);
      refresh(s, path);
      if (attempt()) return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
}

// "a, b" of the keys pred(key) is false for.
template <typename Pred>
std::string keys_not(const std::vector<std::string>& keys, Pred pred) {
  std::string out;
  for (const auto& key : keys) {
    if (!pred(key)) out += (out.empty() ? "" : ", ") + key;
  }
  return out;
}

int64_t parse_counter(const State& s, const std::string& key, const std::string& path) {
  auto it = s.data.find(key);
  if (it == s.data.end()) return 0;
  std::string text(it->second.begin(), it->second.end());
  try {
    size_t used = 0;
    int64_t v = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    TDIST_THROW(StoreError, "FileStore::add: the value of key '" + key + "' in '" + path +
                                "' is not an integer");
  }
}

int64_t add_locked(State& s, const std::string& path, const std::string& key, int64_t value) {
  const int64_t result = static_cast<int64_t>(static_cast<uint64_t>(parse_counter(s, key, path)) +
                                              static_cast<uint64_t>(value));
  append_record(s, path, kSetRecord, key, bytes_of(std::to_string(result)));
  return result;
}

}  // namespace

FileStore::FileStore(std::string path, int num_workers, std::chrono::milliseconds timeout)
    : Store(timeout),
      path_(std::move(path)),
      num_workers_(num_workers),
      state_(std::make_unique<detail::FileStoreState>()) {
  TDIST_CHECK_ARG(!path_.empty(), "FileStore: the path is empty; use file:///some/shared/file");
  state_->fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (state_->fd < 0) {
    TDIST_THROW(StoreError, "FileStore: cannot open '" + path_ + "': " + errno_text() +
                                "; the directory must exist and be writable by every rank");
  }
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, true, timeout_, path_);
  refresh(*state_, path_);
  if (num_workers_ > 0) {
    const int64_t joined = parse_counter(*state_, kJoinedKey, path_);
    if (joined >= num_workers_) {
      TDIST_THROW(StoreError,
                  "FileStore: '" + path_ + "' is stale: " + std::to_string(joined) +
                      " workers have already joined it and this job has num_workers=" +
                      std::to_string(num_workers_) +
                      " (left over from an earlier run that did not finish cleanly?). Delete "
                      "the file (rm '" +
                      path_ + "') or use a new path, then restart every rank");
    }
  }
  add_locked(*state_, path_, kJoinedKey, 1);
}

FileStore::~FileStore() {
  if (!state_ || state_->fd < 0) return;
  try {
    std::lock_guard<std::mutex> guard(state_->mutex);
    FileLock lock(state_->fd, true, std::min(timeout_, std::chrono::milliseconds(10000)), path_);
    refresh(*state_, path_);
    const int64_t left = add_locked(*state_, path_, kLeftKey, 1);
    // The last worker of the job removes the file, so the next run starts clean (as c10d).
    if (num_workers_ > 0 && left >= num_workers_) ::unlink(path_.c_str());
  } catch (const std::exception& e) {
    std::cerr << "tdist FileStore: cleanup of '" << path_ << "' failed: " << e.what() << "\n";
  }
}

void FileStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, true, timeout_, path_);
  refresh(*state_, path_);
  append_record(*state_, path_, kSetRecord, key, value);
}

std::vector<uint8_t> FileStore::get(const std::string& key) {
  return values_of("FileStore::get", {key}).front();
}

std::vector<std::vector<uint8_t>> FileStore::values_of(const char* op,
                                                       const std::vector<std::string>& keys) {
  State& s = *state_;
  auto is_set = [&s](const std::string& key) { return s.data.count(key) > 0; };
  std::vector<std::vector<uint8_t>> values;
  // A value, not a queue of the same name, releases a get; the values are read under the
  // same lock that saw them all, so a delete cannot come between.
  const bool ok = poll(s, path_, false, timeout_, timeout_, [&] {
    for (const auto& key : keys) {
      if (!is_set(key)) return false;
    }
    for (const auto& key : keys) values.push_back(s.data.at(key));
    return true;
  });
  if (!ok) {
    std::string missing;
    {
      std::lock_guard<std::mutex> guard(s.mutex);
      missing = keys_not(keys, is_set);
    }
    TDIST_THROW(TimeoutError, std::string(op) + ": keys [" + missing + "] not set within " +
                                  std::to_string(timeout_.count()) + " ms (file '" + path_ +
                                  "'); a rank that should set them may be missing or slow");
  }
  return values;
}

int64_t FileStore::add(const std::string& key, int64_t value) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, true, timeout_, path_);
  refresh(*state_, path_);
  return add_locked(*state_, path_, key, value);
}

std::vector<uint8_t> FileStore::compare_set(const std::string& key,
                                            const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, true, timeout_, path_);
  refresh(*state_, path_);
  auto it = state_->data.find(key);
  if ((it == state_->data.end() && expected.empty()) ||
      (it != state_->data.end() && it->second == expected)) {
    append_record(*state_, path_, kSetRecord, key, desired);
    return desired;
  }
  return it == state_->data.end() ? expected : it->second;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, false, timeout_, path_);
  refresh(*state_, path_);
  for (const auto& key : keys) {
    if (!present(*state_, key)) return false;
  }
  return true;
}

bool FileStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, true, timeout_, path_);
  refresh(*state_, path_);
  if (state_->data.count(key) == 0) return false;
  append_record(*state_, path_, kDeleteRecord, key, {});
  return true;
}

int64_t FileStore::num_keys() {
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, false, timeout_, path_);
  refresh(*state_, path_);
  return static_cast<int64_t>(state_->data.size() - state_->reserved);
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  State& s = *state_;
  auto is_present = [&s](const std::string& key) { return present(s, key); };
  const bool ok = poll(s, path_, false, timeout_, timeout, [&] {
    for (const auto& key : keys) {
      if (!is_present(key)) return false;
    }
    return true;
  });
  if (!ok) {
    std::string missing;
    {
      std::lock_guard<std::mutex> guard(s.mutex);
      missing = keys_not(keys, is_present);
    }
    TDIST_THROW(TimeoutError, "FileStore::wait: keys [" + missing + "] not set within " +
                                  std::to_string(timeout.count()) + " ms (file '" + path_ +
                                  "'); a rank that should set them may be missing or slow");
  }
}

void FileStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, true, timeout_, path_);
  refresh(*state_, path_);
  auto it = state_->data.find(key);
  std::vector<uint8_t> joined = it == state_->data.end() ? std::vector<uint8_t>{} : it->second;
  joined.insert(joined.end(), value.begin(), value.end());
  append_record(*state_, path_, kSetRecord, key, joined);
}

std::vector<std::vector<uint8_t>> FileStore::multi_get(const std::vector<std::string>& keys) {
  return values_of("FileStore::multi_get", keys);
}

void FileStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::vector<uint8_t>>& values) {
  check_multi_set_args("FileStore::multi_set", keys, values);
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, true, timeout_, path_);
  refresh(*state_, path_);
  // Readers replay under the shared lock, so they see all of these records or none.
  for (size_t i = 0; i < keys.size(); ++i) {
    append_record(*state_, path_, kSetRecord, keys[i], values[i]);
  }
}

void FileStore::queue_push(const std::string& key, const std::vector<uint8_t>& value) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, true, timeout_, path_);
  refresh(*state_, path_);
  append_record(*state_, path_, kQueuePushRecord, key, value);
}

std::vector<uint8_t> FileStore::queue_pop(const std::string& key, bool block,
                                          std::chrono::milliseconds timeout) {
  State& s = *state_;
  std::vector<uint8_t> value;
  auto take = [&] {
    auto it = s.queues.find(key);
    if (it == s.queues.end()) return false;
    value = it->second.front();
    append_record(s, path_, kQueuePopRecord, key, {});
    return true;
  };
  if (!block) {
    std::lock_guard<std::mutex> guard(s.mutex);
    FileLock lock(s.fd, true, timeout_, path_);
    refresh(s, path_);
    if (!take()) TDIST_THROW(QueueEmptyError, "FileStore::queue_pop: queue '" + key + "' is empty");
    return value;
  }
  // Polls under the exclusive lock: the pop is written by whoever saw the item.
  if (!poll(s, path_, true, timeout_, timeout, take)) {
    TDIST_THROW(TimeoutError, "FileStore::queue_pop: queue '" + key + "' stayed empty for " +
                                  std::to_string(timeout.count()) + " ms (file '" + path_ +
                                  "'); nothing was pushed to it in time (a rank that should "
                                  "push may be missing or slow, or every item was popped)");
  }
  return value;
}

int64_t FileStore::queue_len(const std::string& key) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  FileLock lock(state_->fd, false, timeout_, path_);
  refresh(*state_, path_);
  auto it = state_->queues.find(key);
  return it == state_->queues.end() ? 0 : static_cast<int64_t>(it->second.size());
}

}  // namespace tdist

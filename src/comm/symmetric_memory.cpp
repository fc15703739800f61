#include "tdist/comm/symmetric_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <ATen/ATen.h>

#include "tdist/detail/comm/engine/shm_object.h"
#include "tdist/detail/comm/engine/symmetric_registry.h"
#include "tdist/error.h"

namespace tdist {

namespace detail {

namespace {

struct Allocation {
  size_t len = 0;
  uint64_t id = 0;
};

// Live allocations of this process by base address.
std::mutex registry_mutex;
std::map<uintptr_t, Allocation>& registry() {
  static auto* allocations = new std::map<uintptr_t, Allocation>();
  return *allocations;
}

uint64_t next_id() {
  static std::atomic<uint32_t> counter{0};
  return (uint64_t(static_cast<uint32_t>(::getpid())) << 32) | (counter.fetch_add(1) + 1);
}

void release(void* ptr) {
  Allocation a;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = registry().find(reinterpret_cast<uintptr_t>(ptr));
    if (it == registry().end()) return;
    a = it->second;
    registry().erase(it);
  }
  ::munmap(ptr, a.len);
  // Peers that mapped it keep their pages until they notice the unlink (SymmetricMappings).
  ::shm_unlink(symmetric_name(a.id).c_str());
}

// Note [Names at exit]: an allocation still alive when the process exits (owned by a leaked
// or static object, as after an error that ends a program early) would leave its name in
// /dev/shm, holding its pages until some later Gloo group sweeps it (remove_stale_shm_objects,
// half a minute on). At exit every live name is unlinked: the pages go with the last mapping.
void unlink_live_names_at_exit() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (const auto& [base, allocation] : registry()) {
    ::shm_unlink(symmetric_name(allocation.id).c_str());
  }
}

}  // namespace

std::string symmetric_name(uint64_t id) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "/tdist-sym-%ld-%llu", static_cast<long>(id >> 32),
                static_cast<unsigned long long>(id & 0xffffffffULL));
  return buf;
}

SymmetricRef find_symmetric(const void* ptr, size_t bytes) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& r = registry();
  auto it = r.upper_bound(p);
  if (it == r.begin()) return {};
  --it;
  if (p + bytes > it->first + it->second.len) return {};
  return {it->second.id, static_cast<int64_t>(p - it->first)};
}

SymmetricMappings::~SymmetricMappings() {
  for (auto& [id, m] : maps_) {
    ::munmap(m.ptr, m.len);
    ::close(m.fd);
  }
}

void SymmetricMappings::drop_freed() {
  for (auto it = maps_.begin(); it != maps_.end();) {
    if (shm_object_unlinked(it->second.fd)) {
      ::munmap(it->second.ptr, it->second.len);
      ::close(it->second.fd);
      it = maps_.erase(it);
    } else {
      ++it;
    }
  }
}

const char* SymmetricMappings::map(uint64_t id, int64_t offset, size_t bytes, int self, int owner) {
  auto it = maps_.find(id);
  if (it == maps_.end()) {
    drop_freed();
    Mapping m;
    m.ptr = map_shm_object(symmetric_name(id), false, &m.len, &m.fd);
    if (!m.ptr) {
      TDIST_THROW(DistBackendError, "rank " + std::to_string(self) +
                                        ": cannot map the symmetric memory of rank " +
                                        std::to_string(owner) + " (" + symmetric_name(id) +
                                        "): " + std::strerror(errno));
    }
    it = maps_.emplace(id, m).first;
  }
  const Mapping& m = it->second;
  if (offset < 0 || static_cast<size_t>(offset) + bytes > m.len) {
    TDIST_THROW(DistBackendError, "rank " + std::to_string(self) + ": rank " +
                                      std::to_string(owner) + "'s symmetric tensor (" +
                                      std::to_string(bytes) + " bytes at offset " +
                                      std::to_string(offset) + ") lies outside its allocation of " +
                                      std::to_string(m.len) + " bytes");
  }
  return m.ptr + offset;
}

at::DataPtr allocate_symmetric(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t len = std::max(page, (bytes + page - 1) / page * page);
  static const bool unlink_at_exit = std::atexit(unlink_live_names_at_exit) == 0;
  (void)unlink_at_exit;
  const uint64_t id = next_id();
  std::string error;
  char* ptr = create_shm_object(symmetric_name(id), len, error);
  if (!ptr) {
    TDIST_THROW(DistBackendError,
                "symmetric memory (" + std::to_string(bytes) + " bytes): " + error);
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    registry()[reinterpret_cast<uintptr_t>(ptr)] = {len, id};
  }
  return at::DataPtr(ptr, ptr, release, at::Device(at::kCPU));
}

}  // namespace detail

namespace symmetric_memory {

at::DataPtr allocate(size_t bytes) {
  return detail::allocate_symmetric(bytes);
}

bool is_available() {
  const char* env = std::getenv("TDIST_GLOO_SHM");
  if (env && std::strcmp(env, "0") == 0) return false;
  return ::access("/dev/shm", W_OK) == 0;
}

at::Tensor empty(at::IntArrayRef sizes, at::TensorOptions options) {
  TDIST_CHECK_ARG(options.device().is_cpu(),
                  "symmetric_memory::empty: only CPU tensors can live in symmetric memory (got " +
                      options.device().str() + ")");
  int64_t numel = 1;
  for (int64_t s : sizes) {
    TDIST_CHECK_ARG(s >= 0, "symmetric_memory::empty: negative size " + std::to_string(s));
    numel *= s;
  }
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  at::DataPtr data = detail::allocate_symmetric(bytes);
  void* ptr = data.release_context();
  return at::from_blob(ptr, sizes, detail::release, options.device(at::kCPU));
}

bool is_symmetric(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.numel() > 0 &&
         detail::find_symmetric(t.data_ptr(), t.nbytes()).id != 0;
}

}  // namespace symmetric_memory

}  // namespace tdist

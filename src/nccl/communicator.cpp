#include "nccl/communicator.h"

#include <cstring>
#include <thread>
#include <vector>

#include <c10/cuda/CUDAGuard.h>

#include "nccl/nccl_types.h"
#include "tdist/error.h"

namespace tdist::nccl::detail {

namespace {

const char* const kUniqueIdKey = "nccl/unique_id";

std::string ms_text(std::chrono::milliseconds t) {
  return std::to_string(t.count()) + " ms";
}

ncclUniqueId share_unique_id(Store& store, int rank) {
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      TDIST_THROW(DistBackendError, "nccl: rank 0 could not make the communicator's unique id: " +
                                        nccl_error_text(r) +
                                        " (check NCCL_SOCKET_IFNAME and NCCL_DEBUG=INFO)");
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(kUniqueIdKey, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    return id;
  }
  std::vector<uint8_t> bytes = store.get(kUniqueIdKey);
  if (bytes.size() != sizeof(id)) {
    TDIST_THROW(DistBackendError, "nccl: the unique id in the store has " +
                                      std::to_string(bytes.size()) + " bytes, not " +
                                      std::to_string(sizeof(id)) +
                                      "; do all ranks use the same NCCL?");
  }
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

}  // namespace

std::unique_ptr<Communicator> Communicator::create(Store& store, int rank, int size, int device,
                                                   std::chrono::milliseconds timeout) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const ncclUniqueId id = share_unique_id(store, rank);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    TDIST_THROW(DistBackendError, "nccl: rank " + std::to_string(rank) +
                                      " could not create its communicator on cuda:" +
                                      std::to_string(device) + ": " + nccl_error_text(r));
  }
  std::unique_ptr<Communicator> out(new Communicator(comm, device));
  try {
    out->check(r, "communicator initialisation", Clock::now() + timeout);
  } catch (const DistBackendError&) {
    out->abort();  // a failed initialisation cannot be finalised (that would wait 10 s)
    throw;
  } catch (const TimeoutError&) {
    out->abort();
    TDIST_THROW(TimeoutError,
                "nccl: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                    ": the communicator did not come up within " + ms_text(timeout) +
                    "; every rank must reach init_process_group (or new_group) and use its own "
                    "GPU: NCCL refuses two ranks on one GPU (use gloo for CUDA tensors then). "
                    "NCCL_DEBUG=INFO shows where it stopped");
  }
  return out;
}

std::unique_ptr<Communicator> Communicator::finish_derived(const Communicator& parent,
                                                           ncclResult_t result, ncclComm_t comm,
                                                           const std::string& what,
                                                           std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (result == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::yield();
    ncclCommGetAsyncError(comm != nullptr ? comm : parent.comm_, &result);
  }
  if (result == ncclSuccess) {
    if (comm == nullptr) return nullptr;
    return std::unique_ptr<Communicator>(new Communicator(comm, parent.device_));
  }
  if (comm != nullptr) ncclCommAbort(comm);
  if (result == ncclInProgress) {
    TDIST_THROW(TimeoutError, "nccl: " + what + " on cuda:" + std::to_string(parent.device_) +
                                  " did not complete within " + ms_text(timeout) +
                                  "; every rank taking part must call it");
  }
  TDIST_THROW(DistBackendError, "nccl: " + what + " failed: " + nccl_error_text(result));
}

std::unique_ptr<Communicator> Communicator::split(const Communicator& parent, int color, int key,
                                                  std::chrono::milliseconds timeout) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(parent.device_));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const Lease lease = parent.lease();
  const ncclResult_t r =
      ncclCommSplit(parent.comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &comm, &config);
  return finish_derived(parent, r, comm, "ncclCommSplit", timeout);
#else
  (void)parent, (void)color, (void)key, (void)timeout;
  TDIST_THROW(InvalidArgument, "nccl: split_group needs ncclCommSplit (NCCL 2.18 or newer)");
#endif
}

bool Communicator::can_shrink() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> Communicator::shrink(const Communicator& parent,
                                                   std::vector<int> excluded, int flags,
                                                   std::chrono::milliseconds timeout) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(parent.device_));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const Lease lease = parent.lease();
  const ncclResult_t r =
      ncclCommShrink(parent.comm_, excluded.data(), static_cast<int>(excluded.size()), &comm,
                     &config, flags == 0 ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT);
  return finish_derived(parent, r, comm, "ncclCommShrink", timeout);
#else
  (void)parent, (void)excluded, (void)flags, (void)timeout;
  TDIST_THROW(InvalidArgument, "nccl: shrink_group needs ncclCommShrink (NCCL 2.27 or newer)");
#endif
}

Communicator::Lease Communicator::lease() const {
  Lease lease(mutex_);
  if (aborted_.load()) {
    TDIST_THROW(DistBackendError,
                "nccl: the communicator on cuda:" + std::to_string(device_) +
                    " was aborted by an earlier failure; destroy the process group and "
                    "create a new one");
  }
  return lease;
}

void Communicator::check(ncclResult_t result, const std::string& what, Clock::time_point deadline) {
  while (result == ncclInProgress) {
    if (Clock::now() >= deadline) {
      TDIST_THROW(TimeoutError, "nccl: " + what + " did not complete in time");
    }
    std::this_thread::yield();
    ncclCommGetAsyncError(comm_, &result);
  }
  if (result != ncclSuccess) {
    TDIST_THROW(DistBackendError, "nccl: " + what + " failed: " + nccl_error_text(result, comm_));
  }
}

ncclResult_t Communicator::async_error() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  if (aborted_.load()) return ncclSuccess;
  ncclResult_t result = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &result) != ncclSuccess) return ncclInternalError;
  return result == ncclInProgress ? ncclSuccess : result;
}

void Communicator::abort() {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (aborted_.load()) return;
  ncclCommAbort(comm_);
  aborted_.store(true);
}

Communicator::~Communicator() {
  if (aborted_.load()) return;
  // A healthy communicator finishes its queued work first; one that cannot (a peer gone
  // since the last collective) must not hang the process at exit: abort after a bound.
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  ncclResult_t r = ncclCommFinalize(comm_);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (r == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(comm_, &r);
  }
  if (r == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
}

}  // namespace tdist::nccl::detail

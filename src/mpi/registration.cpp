#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "mpi/executor.h"
#include "tdist/comm/backend.h"
#include "tdist/error.h"
#include "tdist/mpi/mpi_backend.h"
#include "tdist/store/tcp_store.h"

namespace tdist::mpi {

void register_mpi_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (tdist::detail::backend_registered("mpi")) return;
    Backend::register_backend(
        "mpi",
        [](const StorePtr& store, int rank, int size, std::chrono::milliseconds timeout) {
          if (size > 1 && !launched_by_mpirun() && store) {
            // Every rank raises the same error: wait (briefly) until all have come this far,
            // so that rank 0, which hosts the store, does not exit before the others.
            const auto until =
                std::chrono::steady_clock::now() +
                std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(10));
            try {
              store->add("mpi/not_launched_by_mpirun", 1);
              while (store->add("mpi/not_launched_by_mpirun", 0) < size &&
                     std::chrono::steady_clock::now() < until) {
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
              }
            } catch (...) {
              // The error below is what matters.
            }
          }
          check_mpi_launch(rank, size);
          return std::make_shared<MPIBackend>(store, rank, size, timeout);
        },
        /*extended_api=*/true, {"cpu"});
    Backend::register_launch_bootstrap(
        "mpi", [](std::chrono::milliseconds timeout) -> std::optional<LaunchInfo> {
          if (!launched_by_mpirun()) return std::nullopt;
          return LaunchInfo{bootstrap_store(timeout), world_rank(), world_size()};
        });
  });
}

void check_mpi_launch(int rank, int size) {
  // Note [MPI under tdistrun]: tdistrun (like torchrun) forks plain processes by default.
  // Each would initialise MPI as a singleton, a world of one, and OpenMPI singletons cannot
  // join each other, so the group could never form: say so at once instead of failing
  // inside MPI. `tdistrun --launcher mpirun` starts the workers through one mpirun instead
  // (src/launch/mpirun_launch.cpp), which makes them one MPI world.
  if (size <= 1 || launched_by_mpirun()) return;
  TDIST_THROW(InvalidArgument,
              "rank " + std::to_string(rank) + ": init_process_group(backend=\"mpi\") with " +
                  "world_size " + std::to_string(size) +
                  ", but this process was not started by mpirun (no OMPI_COMM_WORLD_SIZE/"
                  "PMI_SIZE in its environment; a plain tdistrun or torchrun forks plain "
                  "processes, and MPI cannot join those into one world). Under tdistrun, add "
                  "`--launcher mpirun` (tdistrun --launcher mpirun --nproc-per-node " +
                  std::to_string(size) + " <program>), or start the job with `mpirun -n " +
                  std::to_string(size) +
                  " <program>` (rank and world size then come from MPI), or use backend "
                  "\"gloo\"");
}

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

int world_rank() {
  return detail::Executor::instance().world_rank();
}
int world_size() {
  return detail::Executor::instance().world_size();
}

StorePtr bootstrap_store(std::chrono::milliseconds timeout) {
  auto& executor = detail::Executor::instance();
  const bool is_server = executor.world_rank() == 0;
  // Rank 0 hosts the store: on loopback when the whole job is on one node, else on its
  // host name (or MASTER_ADDR when given), and tells everyone where with MPI_Bcast.
  char host[256] = "127.0.0.1";
  if (const char* addr = std::getenv("MASTER_ADDR")) {
    std::snprintf(host, sizeof(host), "%s", addr);
  } else {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (local != nullptr && std::atoi(local) != executor.world_size()) {
      ::gethostname(host, sizeof(host) - 1);
    }
  }
  std::shared_ptr<TCPStore> store;
  int port = 0;
  std::string failure;
  if (is_server) {
    // A store rank 0 cannot host (e.g. its host name does not resolve) must fail every rank,
    // not leave the others waiting in MPI_Bcast: port -1 and the reason go out instead.
    try {
      store = std::make_shared<TCPStore>(
          host, TCPStoreOptions().port(0).is_server(true).timeout(timeout).wait_for_workers(false));
      port = store->port();
    } catch (const std::exception& e) {
      failure = e.what();
      port = -1;
      std::snprintf(host, sizeof(host), "%s", failure.c_str());
    }
  }
  executor.run_sync([&] {
    detail::check_mpi(MPI_Bcast(host, sizeof(host), MPI_CHAR, 0, MPI_COMM_WORLD),
                      "MPI_Bcast(store host)");
    detail::check_mpi(MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast(store port)");
  });
  if (port < 0) {
    TDIST_THROW(StoreError, "mpi: rank 0 could not host the job's store: " +
                                (is_server ? failure : std::string(host)) +
                                " (set MASTER_ADDR to an address of rank 0's host)");
  }
  if (!is_server) {
    store = std::make_shared<TCPStore>(host, TCPStoreOptions().port(port).timeout(timeout));
  }
  return store;
}

}  // namespace tdist::mpi

// Note [Backend registration anchor]: static libraries drop object files nothing refers
// to, and with them their static initialisers. tdist::tdist links with
// -Wl,--undefined=tdist_mpi_registration_anchor, which pulls this file in, so "mpi" is
// registered before main() in every program that links tdist::tdist.
extern "C" {
int tdist_mpi_registration_anchor = 0;
}
namespace {
const bool kRegistered = [] {
  tdist::mpi::register_mpi_backend();
  return true;
}();
}  // namespace

#pragma once

// The world backend of an SPMD test binary run under mpirun: built on first use, shared by
// every test of the binary (MPI can be initialised only once per process).

#include <chrono>
#include <memory>

#include "tdist/mpi/mpi_backend.h"

namespace tdist::mpi::testing {

inline MPIBackend& pg() {
  static auto backend =
      std::make_shared<MPIBackend>(nullptr, world_rank(), world_size(), std::chrono::seconds(60));
  return *backend;
}
inline int rank() {
  return pg().rank();
}
inline int world() {
  return pg().size();
}

}  // namespace tdist::mpi::testing

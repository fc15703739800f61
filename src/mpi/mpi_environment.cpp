#include "mpi/mpi_environment.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "tdist/detail/util/env.h"
#include "tdist/error.h"

namespace tdist::mpi::detail {

namespace {

void read_switch(const char* name, bool& value) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return;
  const std::string text(env);
  TDIST_CHECK_ARG(text == "0" || text == "1",
                  std::string(name) + "='" + text + "': expected 0 (off) or 1 (on, the default)");
  value = text == "1";
}

void read_bytes(const char* name, int64_t& value) {
  value = util::env_integer(name, -1, "a number of bytes (an integer, or -1 where no limit)")
              .value_or(value);
}

}  // namespace

MPIEnvironment MPIEnvironment::from_env() {
  MPIEnvironment env;
  read_switch("TDIST_MPI_SHM", env.shared_memory);
  read_bytes("TDIST_MPI_SHM_MIN_BYTES", env.shm_min_bytes);
  read_bytes("TDIST_MPI_SHM_MAX_BYTES", env.shm_max_bytes);
  read_bytes("TDIST_MPI_SHM_PIECE_BYTES", env.piece_bytes);
  // Halves are multiples of 4 KiB, so every element type stays aligned.
  env.piece_bytes = (std::max<int64_t>(env.piece_bytes, 4096) + 4095) / 4096 * 4096;
  read_switch("TDIST_MPI_SHM_INLINE", env.inline_start);
  read_switch("TDIST_MPI_SHM_CMA", env.peer_reads);
  read_bytes("TDIST_MPI_SHM_CMA_MIN_BYTES", env.peer_read_min_bytes);
  read_bytes("TDIST_MPI_SHM_CMA_MAX_BYTES", env.peer_read_max_bytes);
  read_bytes("TDIST_MPI_DIRECT_MIN_BYTES", env.direct_min_bytes);
  return env;
}

}  // namespace tdist::mpi::detail

# Every dependency comes from Debian's packages (see tools/setup.sh).
find_package(Torch REQUIRED)
find_package(Gloo REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(fmt REQUIRED)

set(TDIST_HAVE_MPI OFF)
if(TDIST_WITH_MPI)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(TDIST_HAVE_MPI ON)
  endif()
endif()

# LibTorch's CMake config hands out flags as a string; turn them into a target.
if(NOT TARGET tdist_torch)
  add_library(tdist_torch INTERFACE)
  target_link_libraries(tdist_torch INTERFACE ${TORCH_LIBRARIES})
  target_include_directories(tdist_torch INTERFACE ${TORCH_INCLUDE_DIRS})
  separate_arguments(_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(tdist_torch INTERFACE ${_torch_flags})
endif()

# LibTorch: PyTorch's own build from PyPI, installed by tools/setup.sh into .venv/ (pinned in
# tools/torch-version.txt), or any other LibTorch 2.x through -DCMAKE_PREFIX_PATH.
set(TDIST_TORCH_FLOOR 2.9)
if(NOT Torch_DIR AND EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  execute_process(
    COMMAND ${PROJECT_SOURCE_DIR}/.venv/bin/python -c
            "import torch.utils; print(torch.utils.cmake_prefix_path, end='')"
    OUTPUT_VARIABLE _venv_torch_prefix RESULT_VARIABLE _venv_rc ERROR_QUIET)
  if(_venv_rc EQUAL 0)
    list(APPEND CMAKE_PREFIX_PATH ${_venv_torch_prefix})
  endif()
endif()
find_package(Torch REQUIRED)
set(TDIST_TORCH_VERSION ${Torch_VERSION})  # from TorchConfigVersion.cmake
if(TDIST_TORCH_VERSION VERSION_LESS TDIST_TORCH_FLOOR)
  message(FATAL_ERROR "tdist needs LibTorch ${TDIST_TORCH_FLOOR} or newer; found "
    "${TDIST_TORCH_VERSION} at ${Torch_DIR}. Run tools/setup.sh (it installs the pinned "
    "PyTorch into .venv/) or pass -DCMAKE_PREFIX_PATH=<a LibTorch ${TDIST_TORCH_FLOOR}+>.")
endif()
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  message(FATAL_ERROR "the LibTorch at ${Torch_DIR} (${TDIST_TORCH_VERSION}) is built with the "
    "pre-C++11 libstdc++ ABI (-D_GLIBCXX_USE_CXX11_ABI=0), and tdist links Debian's libraries, "
    "which use the C++11 ABI. Use a cxx11-ABI LibTorch: PyTorch's wheels from 2.7 on, or a "
    "'cxx11-abi' libtorch archive.")
endif()
message(STATUS "tdist: LibTorch ${TDIST_TORCH_VERSION} (${Torch_DIR})")

# The Python that runs the interchange tests and the PyTorch side of the benchmarks: the
# project's .venv/ (the same PyTorch release as the LibTorch), else python3.
if(NOT TDIST_PYTHON)
  if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
    set(TDIST_PYTHON ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  else()
    find_program(TDIST_PYTHON python3)
  endif()
endif()

find_package(Gloo REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(nlohmann_json REQUIRED)
# PCRE2: the Unicode regexes of the tokenizers' pre-tokenizers (libpcre2-dev).
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# SentencePiece: Llama 2's and Mistral's tokenizer.model (libsentencepiece-dev).
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
# utf8proc: Unicode NFC for the tokenizers' normalizer (libutf8proc-dev).
pkg_check_modules(UTF8PROC REQUIRED libutf8proc)

set(TDIST_HAVE_MPI OFF)
if(TDIST_WITH_MPI)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(TDIST_HAVE_MPI ON)
  endif()
endif()

# NCCL (docs/nccl.md): built whenever the LibTorch has CUDA; nothing here needs a GPU to
# compile or link. One NCCL per process: the one LibTorch's libtorch_cuda loads (a PyPI
# wheel's nvidia/nccl beside torch/), else the CUDA toolkit's, which then is the only one.
set(TDIST_HAVE_NCCL OFF)
if(TDIST_WITH_NCCL AND C10_CUDA_LIBRARY AND TARGET CUDA::cudart)
  set(_nccl_hints ${TORCH_INSTALL_PREFIX}/../nvidia/nccl ${CUDAToolkit_LIBRARY_ROOT}
    ${CUDAToolkit_TARGET_DIR})
  find_path(TDIST_NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
  find_library(TDIST_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_hints}
    PATH_SUFFIXES lib lib64)
  if(TDIST_NCCL_INCLUDE_DIR AND TDIST_NCCL_LIBRARY)
    file(STRINGS ${TDIST_NCCL_INCLUDE_DIR}/nccl.h _nccl_version_lines
      REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*"
      "\\1.\\2.\\3" TDIST_NCCL_VERSION "${_nccl_version_lines}")
    set(TDIST_HAVE_NCCL ON)
    message(STATUS "tdist: NCCL ${TDIST_NCCL_VERSION} (${TDIST_NCCL_LIBRARY}, ${TDIST_NCCL_INCLUDE_DIR})")
  else()
    message(STATUS "tdist: LibTorch has CUDA but no nccl.h/libnccl was found; no NCCL backend")
  endif()
endif()

# LibTorch's CMake config hands out flags as a string; turn them into a target. Its headers
# are SYSTEM so that tdist's warnings are about tdist's code.
if(NOT TARGET tdist_torch)
  add_library(tdist_torch INTERFACE)
  separate_arguments(_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  # Build tree only: an installed tdist gets these from its own find_package(Torch) (see
  # tdistConfig.cmake.in), so it never bakes in the path of the LibTorch it was built with.
  # Note [libstdc++ before LibTorch]: PyTorch's wheel exports its own copy of parts of
  # libstdc++ from libtorch.so (std::filesystem among them, built against another toolchain's
  # internals), and whatever comes first in the link line serves every program-wide lookup:
  # std::filesystem::remove_all from that copy jumps to address 0. Naming libstdc++ first
  # puts it ahead of LibTorch in the dynamic linker's search order.
  # Each generator expression is quoted: unquoted, a list inside $<BUILD_INTERFACE:...> is cut
  # at its semicolons and the export receives the source directory as an include path.
  target_link_libraries(tdist_torch INTERFACE "$<BUILD_INTERFACE:stdc++;${TORCH_LIBRARIES}>")
  target_include_directories(tdist_torch SYSTEM INTERFACE "$<BUILD_INTERFACE:${TORCH_INCLUDE_DIRS}>")
  target_compile_options(tdist_torch INTERFACE "$<BUILD_INTERFACE:${_torch_flags}>")
endif()

# Under add_subdirectory / FetchContent the dependencies found here are imported targets of
# this directory only, which the parent project's targets that link tdist::tdist cannot see:
# make them global.
if(NOT TDIST_IS_TOP_LEVEL AND CMAKE_VERSION VERSION_GREATER_EQUAL 3.21)
  get_directory_property(_tdist_imported IMPORTED_TARGETS)
  foreach(_target IN LISTS _tdist_imported)
    get_target_property(_global ${_target} IMPORTED_GLOBAL)
    if(NOT _global)
      set_property(TARGET ${_target} PROPERTY IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()

# One shared precompiled header: every target that includes LibTorch reuses it, so the
# ~20 s cost of parsing torch/torch.h is paid once per build directory.
function(tdist_use_pch target)
  if(TDIST_USE_PCH AND TARGET tdist_pch)
    get_target_property(_type ${target} TYPE)
    if(_type STREQUAL "EXECUTABLE")
      target_precompile_headers(${target} REUSE_FROM tdist_pch_exe)
    else()
      target_precompile_headers(${target} REUSE_FROM tdist_pch)
    endif()
  endif()
endfunction()

# tdist_area_include_dir(<area> <out_var>)
# Note [Areas see only their own sources]: an area's private include directory holds one
# entry, a link named <area> to src/<area>, so `#include "<area>/x.h"` works inside the area
# and `#include "<other>/x.h"` fails to compile everywhere else. What areas share lives under
# include/tdist/ (building blocks for engines in include/tdist/detail/comm/engine/).
function(tdist_area_include_dir area out_var)
  set(_dir ${CMAKE_BINARY_DIR}/area_include/${area})
  if(NOT EXISTS ${_dir}/${area})
    file(MAKE_DIRECTORY ${_dir})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${area} ${_dir}/${area} SYMBOLIC)
  endif()
  set(${out_var} ${_dir} PARENT_SCOPE)
endfunction()

# tdist_add_area(NAME <area> [NO_TORCH] [DEPS <areas...>] [LIBS <libs...>] [EXCLUDE <regex>]
#                [REGISTERS <symbol>])
# Builds src/<area>/*.cpp, but those matching EXCLUDE, into the library tdist_<area> (static,
# or shared under BUILD_SHARED_LIBS).
# An area without sources is skipped; one that depends on an area not built is a configure
# error, naming both. The area's sources see the public headers and their own src/<area>/
# only (Note [Areas see only their own sources]). NO_TORCH: the area's own sources never
# include LibTorch (no precompiled header, no direct tdist_torch link). REGISTERS: an engine
# that registers itself from a static initialiser; whatever links the area links that
# initialiser too (Note [Backend registration anchor], src/mpi/registration.cpp).
function(tdist_add_area)
  cmake_parse_arguments(ARG "NO_TORCH" "NAME;EXCLUDE;REGISTERS" "DEPS;LIBS" ${ARGN})
  file(GLOB_RECURSE _sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${ARG_NAME}/*.cpp)
  if(ARG_EXCLUDE)
    list(FILTER _sources EXCLUDE REGEX "${ARG_EXCLUDE}")
  endif()
  if(NOT _sources)
    return()
  endif()
  set(_target tdist_${ARG_NAME})
  add_library(${_target} ${_sources})
  add_library(tdist::${ARG_NAME} ALIAS ${_target})
  # Note [Same objects, static or shared]: every object is position-independent already
  # (CMAKE_POSITION_INDEPENDENT_CODE), and no header keys on a <target>_EXPORTS macro, so a
  # shared build compiles exactly the commands of a static one and switching only relinks.
  # Installed shared areas find each other and LibTorch through their RPATH.
  set_target_properties(${_target} PROPERTIES DEFINE_SYMBOL "" INSTALL_RPATH "$ORIGIN"
    INSTALL_RPATH_USE_LINK_PATH ON)
  tdist_area_include_dir(${ARG_NAME} _private_include)
  target_include_directories(${_target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:include>
    PRIVATE ${_private_include})
  foreach(_dep ${ARG_DEPS})
    if(NOT TARGET tdist_${_dep})
      message(FATAL_ERROR "area ${ARG_NAME} depends on ${_dep}, which is not built (no "
                          "sources, or declared after ${ARG_NAME} in src/CMakeLists.txt)")
    endif()
    target_link_libraries(${_target} PUBLIC tdist_${_dep})
  endforeach()
  if(ARG_NO_TORCH)
    target_link_libraries(${_target} PUBLIC Threads::Threads ${ARG_LIBS})
  else()
    target_link_libraries(${_target} PUBLIC tdist_torch Threads::Threads ${ARG_LIBS})
    tdist_use_pch(${_target})
  endif()
  if(ARG_REGISTERS)
    target_link_options(${_target} INTERFACE "LINKER:--undefined=${ARG_REGISTERS}")
    if(BUILD_SHARED_LIBS)
      # Under --as-needed (Debian's gcc passes it by default) a shared library no object
      # references is dropped, and an --undefined symbol is no reference: keep the engines.
      target_link_options(${_target} INTERFACE "LINKER:--no-as-needed")
    endif()
    set_property(GLOBAL APPEND PROPERTY TDIST_REGISTRATION_ANCHORS ${ARG_REGISTERS})
  endif()
  set_property(GLOBAL APPEND PROPERTY TDIST_AREA_TARGETS ${_target})
endfunction()

# tdist_add_test(<name> SOURCES <files...> [LIBS <libs...>] [LABELS <labels...>]
#                [TIMEOUT <seconds>] [ENV <k=v...>] [NO_UNITY])
# LIBS defaults to tdist (every area); name only the areas a test needs (e.g. tdist_comm),
# so that work in progress in another area never breaks this test's build. Every test links
# the default CPU engine (tdist_gloo); one that needs mpi or nccl names it.
# One GoogleTest executable, registered with CTest as one test (its cases run in-process;
# multi-process cases re-execute the binary, see tests/support/ranks.h). NO_UNITY: each source
# compiled alone (Note [Unity builds]), for tests whose files each keep their own file-local
# helpers of the same names.
function(tdist_add_test name)
  cmake_parse_arguments(ARG "NO_UNITY" "TIMEOUT" "SOURCES;LIBS;LABELS;ENV" ${ARGN})
  if(NOT ARG_LIBS)
    set(ARG_LIBS tdist)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  if(ARG_NO_UNITY)
    set_target_properties(${name} PROPERTIES UNITY_BUILD OFF)
  endif()
  target_link_libraries(${name} PRIVATE tdist_test_support ${ARG_LIBS} tdist_gloo)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  tdist_use_pch(${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  # 77: every case skipped (tests/support/main.cpp).
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
    SKIP_RETURN_CODE 77)
  if(ARG_ENV)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${ARG_ENV}")
  endif()
endfunction()

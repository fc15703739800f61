# Note [pkg-config file]: LibTorch ships no .pc file, so tdist.pc carries LibTorch's flags
# itself, pointing at the LibTorch tdist was built with through the variable torch_prefix
# (`pkg-config --define-variable=torch_prefix=<dir> ...` points elsewhere). Areas are listed
# highest layer first, as a static link needs, and each engine's registration anchor is kept
# (Note [Backend registration anchor]); libstdc++ comes ahead of LibTorch (Note [libstdc++
# before LibTorch]).
get_property(_pc_areas GLOBAL PROPERTY TDIST_AREA_TARGETS)
get_property(_pc_anchors GLOBAL PROPERTY TDIST_REGISTRATION_ANCHORS)
list(REVERSE _pc_areas)

set(_pc_libs "-L\${libdir}")
foreach(_anchor IN LISTS _pc_anchors)
  string(APPEND _pc_libs " -Wl,--undefined=${_anchor}")
endforeach()
# Shared engines nothing references would be dropped under --as-needed (Debian's default).
string(APPEND _pc_libs " -Wl,--push-state,--no-as-needed")
foreach(_area IN LISTS _pc_areas)
  get_target_property(_name ${_area} OUTPUT_NAME)
  if(NOT _name)
    set(_name ${_area})
  endif()
  string(APPEND _pc_libs " -l${_name}")
endforeach()
string(APPEND _pc_libs " -Wl,--pop-state")
set(_pc_torch_libs "-ltorch -ltorch_cpu -lc10")
if(TARGET torch_cuda)
  string(APPEND _pc_torch_libs " -ltorch_cuda -lc10_cuda")
endif()
string(APPEND _pc_libs " -lstdc++ -L\${torch_prefix}/lib -Wl,-rpath,\${torch_prefix}/lib"
  " -Wl,--no-as-needed ${_pc_torch_libs} -Wl,--as-needed")

# What the areas link besides LibTorch: with static areas a consumer links them too.
set(_pc_requires "libpcre2-8 sentencepiece libutf8proc libcrypto")
set(_pc_extra_libs "")
set(_pc_cflags "-I\${includedir}")
if(TDIST_HAVE_MPI)
  string(APPEND _pc_cflags " -DTDIST_HAVE_MPI=1")
  foreach(_dir IN LISTS MPI_CXX_INCLUDE_DIRS)
    string(APPEND _pc_cflags " -I${_dir}")
  endforeach()
  foreach(_lib IN LISTS MPI_CXX_LIBRARIES)
    string(APPEND _pc_extra_libs " ${_lib}")
  endforeach()
endif()
if(TDIST_HAVE_NCCL)
  string(APPEND _pc_cflags " -DTDIST_HAVE_NCCL=1")
  string(APPEND _pc_extra_libs " ${TDIST_NCCL_LIBRARY} $<TARGET_FILE:CUDA::cudart>")
endif()
string(APPEND _pc_extra_libs " -pthread ${CMAKE_DL_LIBS}")
if(NOT CMAKE_DL_LIBS STREQUAL "")
  string(REPLACE " dl" " -ldl" _pc_extra_libs "${_pc_extra_libs}")
endif()
if(BUILD_SHARED_LIBS)
  set(_pc_requires_field "Requires.private: ${_pc_requires}")
  set(_pc_libs_private "Libs.private:${_pc_extra_libs}")
  string(APPEND _pc_libs " -Wl,-rpath,\${libdir}")
else()
  set(_pc_requires_field "Requires: ${_pc_requires}")
  set(_pc_libs_private "")
  string(APPEND _pc_libs "${_pc_extra_libs}")
endif()
foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
  string(REPLACE "${TORCH_INSTALL_PREFIX}" "\${torch_prefix}" _dir "${_dir}")
  string(APPEND _pc_cflags " -isystem ${_dir}")
endforeach()
string(APPEND _pc_cflags " ${TORCH_CXX_FLAGS} -std=c++17")

# The prefix relative to the .pc file's own folder, so that the installed tree can move.
string(REGEX REPLACE "[^/]+" ".." _pc_up "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
file(GENERATE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/tdist.pc CONTENT
"prefix=\${pcfiledir}/${_pc_up}
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}
torch_prefix=${TORCH_INSTALL_PREFIX}

Name: tdist
Description: PyTorch's distributed training (process groups, DDP, FSDP, checkpoints) for LibTorch
Version: ${PROJECT_VERSION}
${_pc_requires_field}
Cflags: ${_pc_cflags}
Libs: ${_pc_libs}
${_pc_libs_private}
")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tdist.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
  COMPONENT development)

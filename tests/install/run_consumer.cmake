# One consumer program (consumer/main.cpp) built by each route a C++ project takes tdist in:
#   1. find_package(tdist) against the installed static build (this build tree);
#   2. pkg-config against the same install;
#   3. add_subdirectory, then FetchContent, of the source tree, static (subproject/);
#   4. the same with BUILD_SHARED_LIBS=ON (relinks only: Note [Same objects, static or
#      shared]), then find_package and pkg-config against that shared build's install.
# Each consumer runs; the shared ones must load tdist's shared libraries.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
# Output of a command that must succeed.
function(capture out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# The exported targets' include directories must lie inside the installed prefix: a path of the
# build machine (the source tree, say) breaks every consumer once that tree is gone.
function(check_exported_includes prefix)
  file(READ ${prefix}/lib/cmake/tdist/tdistTargets.cmake _targets)
  string(REGEX MATCHALL "INTERFACE_(SYSTEM_)?INCLUDE_DIRECTORIES \"[^\"]*\"" _include_props
         "${_targets}")
  foreach(_prop IN LISTS _include_props)
    string(REGEX REPLACE "^[A-Z_]+ \"(.*)\"$" "\\1" _dirs "${_prop}")
    foreach(_dir IN LISTS _dirs)
      if(NOT _dir MATCHES "^\\$\\{_IMPORT_PREFIX\\}/")
        message(FATAL_ERROR "the installed tdistTargets.cmake exports the include directory "
                            "'${_dir}', outside the install prefix")
      endif()
    endforeach()
  endforeach()
endfunction()

function(build_with_find_package prefix name)
  run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/${name} -G Ninja
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/${name})
  run(${WORK_DIR}/${name}/consumer)
endfunction()

function(build_with_pkg_config prefix name)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
  capture(_flags pkg-config --cflags --libs tdist)
  string(STRIP "${_flags}" _flags)
  separate_arguments(_flags UNIX_COMMAND "${_flags}")
  run(c++ -O1 ${CONSUMER_DIR}/main.cpp -o ${WORK_DIR}/${name} ${_flags})
  run(${WORK_DIR}/${name})
endfunction()

# Fails unless `binary` does (or, with NOT, does not) load a library matching `pattern`.
function(check_needed binary pattern expect)
  capture(_dynamic readelf -d ${binary})
  if(expect AND NOT _dynamic MATCHES "${pattern}")
    message(FATAL_ERROR "${binary} does not load ${pattern}:\n${_dynamic}")
  elseif(NOT expect AND _dynamic MATCHES "${pattern}")
    message(FATAL_ERROR "${binary} loads ${pattern}, which it must not:\n${_dynamic}")
  endif()
endfunction()

# 1-2: the installed static build.
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
check_exported_includes(${WORK_DIR}/prefix)
build_with_find_package(${WORK_DIR}/prefix find-package-static)
build_with_pkg_config(${WORK_DIR}/prefix pkg-config-static)
check_needed(${WORK_DIR}/pkg-config-static "libtdist_" FALSE)

# 3: tdist built inside another project, static; tests and the rest stay off (the
# subproject's CMakeLists.txt fails otherwise).
set(_sub ${WORK_DIR}/subproject)
run(${CMAKE_COMMAND} -S ${SUBPROJECT_DIR} -B ${_sub} -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DTDIST_ROUTE=add_subdirectory -DTDIST_SOURCE_DIR=${SOURCE_DIR} -DBUILD_SHARED_LIBS=OFF)
run(${CMAKE_COMMAND} --build ${_sub} -j 2)
run(${_sub}/consumer)
run(${CMAKE_COMMAND} -S ${SUBPROJECT_DIR} -B ${_sub} -DTDIST_ROUTE=FetchContent
    -DFETCHCONTENT_SOURCE_DIR_TDIST=${SOURCE_DIR})
run(${CMAKE_COMMAND} --build ${_sub} -j 2)
run(${_sub}/consumer)

# 4: the same tree as shared libraries, then installed.
run(${CMAKE_COMMAND} -S ${SUBPROJECT_DIR} -B ${_sub} -DBUILD_SHARED_LIBS=ON)
run(${CMAKE_COMMAND} --build ${_sub} -j 2)
check_needed(${_sub}/consumer "libtdist_fsdp\\.so" TRUE)
run(${_sub}/consumer)
run(${CMAKE_COMMAND} --install ${_sub} --prefix ${WORK_DIR}/prefix-shared)
check_exported_includes(${WORK_DIR}/prefix-shared)
# The launcher never loads LibTorch, shared build or not.
check_needed(${WORK_DIR}/prefix-shared/bin/tdistrun "libtorch" FALSE)
run(${WORK_DIR}/prefix-shared/bin/tdistrun --help)
build_with_find_package(${WORK_DIR}/prefix-shared find-package-shared)
check_needed(${WORK_DIR}/find-package-shared/consumer "libtdist_fsdp\\.so" TRUE)
build_with_pkg_config(${WORK_DIR}/prefix-shared pkg-config-shared)
check_needed(${WORK_DIR}/pkg-config-shared "libtdist_fsdp\\.so" TRUE)

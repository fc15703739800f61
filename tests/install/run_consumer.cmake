# Installs the build tree into a scratch prefix, then configures, builds and runs the
# consumer project against it with find_package(tdist).
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
# The exported targets' include directories must lie inside the installed prefix: a path of the
# build machine (the source tree, say) breaks every consumer once that tree is gone.
file(READ ${WORK_DIR}/prefix/lib/cmake/tdist/tdistTargets.cmake _targets)
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
run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G Ninja
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)

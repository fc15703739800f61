# install + export so that an outside project can find_package(tdist) and link tdist::tdist.
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

get_property(_areas GLOBAL PROPERTY TDIST_AREA_TARGETS)
# Components: "runtime" (shared libraries, when built so, and the launcher) and "development"
# (static libraries, headers, the CMake package): `cmake --install build --component runtime`.
install(TARGETS tdist tdist_torch ${_areas} EXPORT tdistTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(DIRECTORY include/tdist DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
install(EXPORT tdistTargets NAMESPACE tdist:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tdist
  COMPONENT development)
configure_package_config_file(cmake/tdistConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/tdistConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tdist)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tdistConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tdistConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/tdistConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tdist COMPONENT development)

# tdist.pc for pkg-config (Note [pkg-config file]): `pkg-config --cflags --libs tdist`.
include(TdistPkgConfig)

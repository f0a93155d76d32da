# cmake --install: headers, the library and a package config, so that a
# downstream project can find_package(sparse_mla) and link sparse_mla::sparse_mla.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS sparse_mla EXPORT sparse_mlaTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/core/include/sparse_mla DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT sparse_mlaTargets NAMESPACE sparse_mla:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sparse_mla)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/sparse_mlaConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sparse_mlaConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sparse_mla)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sparse_mlaConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sparse_mlaConfig.cmake ${PROJECT_BINARY_DIR}/sparse_mlaConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/SparseMlaKokkosFixup.cmake ${PROJECT_SOURCE_DIR}/cmake/SparseMlaGpu.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sparse_mla)

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY include/overlap DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS overlap overlap_compiled EXPORT overlapTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT overlapTargets NAMESPACE overlap::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/overlap)
configure_package_config_file(cmake/overlapConfig.cmake.in
  ${PROJECT_BINARY_DIR}/overlapConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/overlap)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/overlapConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/overlapConfig.cmake
  ${PROJECT_BINARY_DIR}/overlapConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/overlap)

# pkg-config, for builds without CMake (relocatable: paths relative to the .pc file).
configure_file(cmake/overlap.pc.in ${PROJECT_BINARY_DIR}/overlap.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/overlap.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

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
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/overlapConfig.cmake
  ${PROJECT_BINARY_DIR}/overlapConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/overlap)

# pkg-config, for builds without CMake (relocatable: paths relative to the .pc
# file), one per flavour: overlap (header-only) and overlap-compiled.
foreach(pc overlap overlap-compiled)
  configure_file(cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
install(FILES LICENSE README.md CHANGELOG.md DESTINATION ${CMAKE_INSTALL_DOCDIR})

# The Slurm scripts and what they source, under <prefix>/share/overlap, so a
# job can be submitted from anywhere: the installed sbatch scripts know this
# prefix (@OVERLAP_INSTALLED_HOME@), and common.sh finds the installed apps
# in <prefix>/bin. A relative CMAKE_INSTALL_DATADIR is resolved at install
# time, so `cmake --install --prefix` elsewhere is honoured.
set(overlap_share_subdir ${CMAKE_INSTALL_DATADIR}/overlap)
foreach(script demo bench layer template)
  configure_file(slurm/${script}.sbatch ${PROJECT_BINARY_DIR}/slurm/${script}.sbatch.in COPYONLY)
  install(CODE "
    set(OVERLAP_INSTALLED_HOME \"\${CMAKE_INSTALL_PREFIX}/${overlap_share_subdir}\")
    configure_file(\"${PROJECT_BINARY_DIR}/slurm/${script}.sbatch.in\"
                   \"${PROJECT_BINARY_DIR}/slurm/installed/${script}.sbatch\" @ONLY)")
  install(PROGRAMS ${PROJECT_BINARY_DIR}/slurm/installed/${script}.sbatch DESTINATION ${overlap_share_subdir}/slurm)
endforeach()
install(FILES slurm/common.sh DESTINATION ${overlap_share_subdir}/slurm)
install(FILES tools/mpi/stack DESTINATION ${overlap_share_subdir}/tools/mpi)

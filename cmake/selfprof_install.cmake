# Install rules of selfprof: the headers, the exported target (find_package(selfprof CONFIG) with a
# version file) and selfprof.pc.
include(CMakePackageConfigHelpers)

set(SELFPROF_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/selfprof" CACHE STRING
    "Where selfprofConfig.cmake is installed, relative to the prefix")

install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")
install(TARGETS selfprof EXPORT selfprofTargets)
if(TARGET selfprof_compiled)
  install(TARGETS selfprof_compiled EXPORT selfprofTargets ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}")
endif()
install(EXPORT selfprofTargets NAMESPACE selfprof:: DESTINATION "${SELFPROF_CMAKE_DIR}")

configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/selfprofConfig.cmake.in"
                              "${PROJECT_BINARY_DIR}/selfprofConfig.cmake"
                              INSTALL_DESTINATION "${SELFPROF_CMAKE_DIR}")
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/selfprofConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/selfprofConfig.cmake" "${PROJECT_BINARY_DIR}/selfprofConfigVersion.cmake"
        DESTINATION "${SELFPROF_CMAKE_DIR}")

# pkg-config: the same usage requirements as selfprof::selfprof; the prefix is found relative to the
# .pc file so an install moved with `cmake --install --prefix` still works.
set(_selfprof_pc_dir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
if(IS_ABSOLUTE "${_selfprof_pc_dir}")
  set(SELFPROF_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH SELFPROF_PC_PREFIX "/selfprof-prefix/${_selfprof_pc_dir}" "/selfprof-prefix")
  string(REGEX REPLACE "/$" "" SELFPROF_PC_PREFIX "\${pcfiledir}/${SELFPROF_PC_PREFIX}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(SELFPROF_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  set(SELFPROF_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(SELFPROF_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(SELFPROF_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
set(SELFPROF_PC_FRAME_POINTERS "")
if(SELFPROF_FRAME_POINTERS)
  set(SELFPROF_PC_FRAME_POINTERS " -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer")
endif()
configure_file("${PROJECT_SOURCE_DIR}/cmake/selfprof.pc.in" "${PROJECT_BINARY_DIR}/selfprof.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/selfprof.pc" DESTINATION "${_selfprof_pc_dir}")

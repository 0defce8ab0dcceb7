# Optional libraries of selfprof: detects libdw and zlib when their SELFPROF_WITH_* option is
# ON, links what it finds to the `selfprof` target and defines SELFPROF_HAS_<LIB> to 1 or 0 on it.
# Also fills SELFPROF_PC_REQUIRES / SELFPROF_PC_CFLAGS for selfprof.pc.

find_package(PkgConfig QUIET)
set(SELFPROF_PC_REQUIRES "")
set(SELFPROF_PC_CFLAGS "")

# _selfprof_optional(<NAME> <option> <pc module>): one pkg-config library.
function(_selfprof_optional name option module)
  set(found 0)
  if(${option})
    if(PKG_CONFIG_FOUND)
      pkg_check_modules(SELFPROF_${name} QUIET IMPORTED_TARGET GLOBAL ${module})
    endif()
    if(SELFPROF_${name}_FOUND)
      set(found 1)
      target_link_libraries(selfprof INTERFACE PkgConfig::SELFPROF_${name})
      set(SELFPROF_PC_REQUIRES "${SELFPROF_PC_REQUIRES} ${module}" PARENT_SCOPE)
    else()
      message(STATUS "selfprof: ${module} not found (pkg-config ${module}); SELFPROF_HAS_${name}=0")
    endif()
  endif()
  set(SELFPROF_HAS_${name} ${found} PARENT_SCOPE)
  target_compile_definitions(selfprof INTERFACE SELFPROF_HAS_${name}=${found})
  set(SELFPROF_PC_CFLAGS "${SELFPROF_PC_CFLAGS} -DSELFPROF_HAS_${name}=${found}" PARENT_SCOPE)
endfunction()

_selfprof_optional(LIBDW SELFPROF_WITH_LIBDW libdw)

set(SELFPROF_HAS_ZLIB 0)
if(SELFPROF_WITH_ZLIB)
  find_package(ZLIB QUIET)
  if(ZLIB_FOUND)
    set(SELFPROF_HAS_ZLIB 1)
    # ZLIB::ZLIB is visible only in the directory that found it (and may belong to a parent project), so
    # the build tree links the library path; the installed package re-finds ZLIB::ZLIB.
    target_include_directories(selfprof SYSTEM INTERFACE $<BUILD_INTERFACE:${ZLIB_INCLUDE_DIRS}>)
    target_link_libraries(selfprof INTERFACE $<BUILD_INTERFACE:${ZLIB_LIBRARIES}> $<INSTALL_INTERFACE:ZLIB::ZLIB>)
    string(APPEND SELFPROF_PC_REQUIRES " zlib")
  else()
    message(STATUS "selfprof: zlib not found (find_package(ZLIB)); SELFPROF_HAS_ZLIB=0")
  endif()
endif()
target_compile_definitions(selfprof INTERFACE SELFPROF_HAS_ZLIB=${SELFPROF_HAS_ZLIB})
string(APPEND SELFPROF_PC_CFLAGS " -DSELFPROF_HAS_ZLIB=${SELFPROF_HAS_ZLIB}")

string(STRIP "${SELFPROF_PC_REQUIRES}" SELFPROF_PC_REQUIRES)
message(STATUS "selfprof: SELFPROF_HAS_LIBDW=${SELFPROF_HAS_LIBDW} SELFPROF_HAS_ZLIB=${SELFPROF_HAS_ZLIB}")

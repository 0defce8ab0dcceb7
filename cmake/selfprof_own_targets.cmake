# Build settings for selfprof's own executables (tests, examples, tools, benchmarks) — never for the
# `selfprof` target its users link: strict warnings, the sanitizer chosen by SELFPROF_SANITIZE, and the
# header tree under test (include/ or, with SELFPROF_TEST_SINGLE_INCLUDE, single_include/).

set(_selfprof_sanitize_flags "")
if(SELFPROF_SANITIZE STREQUAL "address,undefined" OR SELFPROF_SANITIZE STREQUAL "address"
   OR SELFPROF_SANITIZE STREQUAL "undefined")
  set(_selfprof_sanitize_flags -fsanitize=${SELFPROF_SANITIZE} -fno-sanitize-recover=all
                               -fno-omit-frame-pointer)
elseif(SELFPROF_SANITIZE STREQUAL "thread")
  set(_selfprof_sanitize_flags -fsanitize=thread)
elseif(NOT SELFPROF_SANITIZE STREQUAL "")
  message(FATAL_ERROR "SELFPROF_SANITIZE='${SELFPROF_SANITIZE}': use address,undefined or thread (or empty)")
endif()
set_property(GLOBAL PROPERTY SELFPROF_SANITIZE_FLAGS "${_selfprof_sanitize_flags}")

# The headers our own targets compile against.
if(SELFPROF_TEST_SINGLE_INCLUDE)
  set(_selfprof_single "${PROJECT_SOURCE_DIR}/single_include/selfprof.hpp")
  if(NOT EXISTS "${_selfprof_single}")
    message(FATAL_ERROR "SELFPROF_TEST_SINGLE_INCLUDE: ${_selfprof_single} is missing; generate it with "
                        "`python3 scripts/amalgamate.py`")
  endif()
  set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_selfprof_single}")
  # Tests may include an internal header (<selfprof/signal/ring.hpp>); in this mode each such header is a
  # stub that includes the single header, which holds them all (scripts/amalgamate.py --shim).
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  set(_selfprof_shim "${PROJECT_BINARY_DIR}/single_include_shim")
  file(GLOB_RECURSE _selfprof_headers CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/include/*.hpp")
  set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_selfprof_headers})
  execute_process(COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/scripts/amalgamate.py" --shim "${_selfprof_shim}"
                  RESULT_VARIABLE _result)
  if(NOT _result EQUAL 0)
    message(FATAL_ERROR "scripts/amalgamate.py --shim failed")
  endif()
  add_library(selfprof_under_test INTERFACE)
  target_include_directories(selfprof_under_test INTERFACE "${PROJECT_SOURCE_DIR}/single_include" "${_selfprof_shim}")
  # Everything but the include path comes from the real target.
  foreach(_prop IN ITEMS INTERFACE_COMPILE_DEFINITIONS INTERFACE_COMPILE_OPTIONS INTERFACE_COMPILE_FEATURES
                         INTERFACE_LINK_LIBRARIES INTERFACE_LINK_OPTIONS)
    get_target_property(_value selfprof ${_prop})
    if(_value)
      set_property(TARGET selfprof_under_test PROPERTY ${_prop} "${_value}")
    endif()
  endforeach()
  message(STATUS "selfprof: own targets compile against single_include/")
else()
  add_library(selfprof_under_test INTERFACE)
  target_link_libraries(selfprof_under_test INTERFACE selfprof)
endif()

# selfprof_own_target(<target>): strict warnings, sanitizers and the headers under test.
function(selfprof_own_target target)
  target_link_libraries(${target} PRIVATE selfprof_under_test)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wundef)
    if(SELFPROF_WERROR)
      target_compile_options(${target} PRIVATE -Werror)
    endif()
  endif()
  get_property(_flags GLOBAL PROPERTY SELFPROF_SANITIZE_FLAGS)
  if(_flags)
    target_compile_options(${target} PRIVATE ${_flags})
    target_link_options(${target} PRIVATE ${_flags})
  endif()
  # Tests may skip what a sanitizer cannot run: doctest::skip(SELFPROF_TEST_SANITIZE_THREAD).
  set(_tsan 0)
  set(_asan 0)
  if(SELFPROF_SANITIZE MATCHES "thread")
    set(_tsan 1)
  endif()
  if(SELFPROF_SANITIZE MATCHES "address")
    set(_asan 1)
  endif()
  target_compile_definitions(${target} PRIVATE SELFPROF_TEST_SANITIZE_THREAD=${_tsan}
                                               SELFPROF_TEST_SANITIZE_ADDRESS=${_asan})
  set_target_properties(${target} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
endfunction()

# The compiled library (SELFPROF_COMPILED=ON) is selfprof's own code too: the same warnings and sanitizer.
if(TARGET selfprof_compiled)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(selfprof_compiled PRIVATE -Wall -Wextra -Wpedantic -Wundef)
    if(SELFPROF_WERROR)
      target_compile_options(selfprof_compiled PRIVATE -Werror)
    endif()
  endif()
  get_property(_flags GLOBAL PROPERTY SELFPROF_SANITIZE_FLAGS)
  if(_flags)
    target_compile_options(selfprof_compiled PRIVATE ${_flags})
  endif()
endif()

#!/usr/bin/env bash
# Packaging test driver (called by CTest): run.sh <step> <source dir> <work dir> <c++ compiler> <generator> <version>
#   install           configure selfprof alone (no tests) and `cmake --install` it into <work dir>/prefix
#   find_package      build and run tests/packaging/consumer against that prefix (find_package CONFIG)
#   pkg_config        compile the consumer with `pkg-config --cflags --libs selfprof` from that prefix, run it
#   add_subdirectory  build and run the consumer with selfprof added via add_subdirectory()
#   meson_subproject  build and run the consumer with Meson, selfprof as subprojects/selfprof
set -euo pipefail
step=$1 src=$2 work=$3 cxx=$4 generator=$5 version=$6
consumer="$src/tests/packaging/consumer"
prefix="$work/prefix"
mkdir -p "$work"

build_consumer() {  # <build dir> <extra cmake args...>
  local dir=$1
  shift
  rm -rf "$dir"
  cmake -S "$consumer" -B "$dir" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
    -DSELFPROF_EXPECTED_VERSION="$version" "$@"
  cmake --build "$dir"
  (cd "$dir" && ./consumer)
}

case "$step" in
  install)
    rm -rf "$work/build-selfprof" "$prefix"
    cmake -S "$src" -B "$work/build-selfprof" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
      -DCMAKE_INSTALL_PREFIX="$prefix" -DSELFPROF_BUILD_TESTS=OFF -DSELFPROF_BUILD_EXAMPLES=OFF \
      -DSELFPROF_BUILD_TOOLS=OFF -DSELFPROF_BUILD_BENCH=OFF
    cmake --build "$work/build-selfprof"
    cmake --install "$work/build-selfprof"
    test -f "$prefix/include/selfprof.hpp" || { echo "include/selfprof.hpp not installed" >&2; exit 1; }
    test -f "$prefix/include/selfprof/config.hpp" || { echo "include/selfprof/ not installed" >&2; exit 1; }
    find "$prefix" -name selfprofConfigVersion.cmake | grep -q . || { echo "no version file" >&2; exit 1; }
    ;;
  find_package)
    build_consumer "$work/build-find-package" -DCMAKE_PREFIX_PATH="$prefix"
    ;;
  pkg_config)
    pc=$(find "$prefix" -name selfprof.pc | head -n1)
    test -n "$pc" || { echo "selfprof.pc not installed under $prefix" >&2; exit 1; }
    export PKG_CONFIG_PATH
    PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    got=$(pkg-config --modversion selfprof)
    [ "$got" = "$version" ] || { echo "pkg-config says version $got, expected $version" >&2; exit 1; }
    flags=$(pkg-config --cflags --libs selfprof)
    echo "pkg-config --cflags --libs selfprof: $flags"
    case " $flags " in *" -fno-omit-frame-pointer "*) ;; *) echo "no -fno-omit-frame-pointer" >&2; exit 1 ;; esac
    case " $flags " in *" -pthread "*) ;; *) echo "no -pthread" >&2; exit 1 ;; esac
    rm -rf "$work/build-pkg-config" && mkdir -p "$work/build-pkg-config"
    # shellcheck disable=SC2086  # the flags are words
    "$cxx" -std=c++17 -Wall -Wextra -Werror -DSELFPROF_EXPECTED_VERSION="\"$version\"" \
      "$consumer/main.cpp" -o "$work/build-pkg-config/consumer" $flags
    (cd "$work/build-pkg-config" && ./consumer)
    ;;
  add_subdirectory)
    build_consumer "$work/build-add-subdirectory" -DSELFPROF_SOURCE_DIR="$src"
    ;;
  meson_subproject)
    dir="$work/meson-consumer"
    rm -rf "$dir" && mkdir -p "$dir/subprojects"
    cp "$consumer/meson.build" "$consumer/main.cpp" "$dir/"
    ln -s "$src" "$dir/subprojects/selfprof"
    CXX="$cxx" meson setup "$dir/build" "$dir"
    meson compile -C "$dir/build"
    (cd "$dir/build" && ./consumer)
    ;;
  *)
    echo "run.sh: unknown step '$step'" >&2
    exit 2
    ;;
esac

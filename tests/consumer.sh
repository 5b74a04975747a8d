#!/usr/bin/env bash
# consumer.sh BUILD_DIR SRC_DIR - installs the build into a scratch prefix, then builds a program
# against it twice (pkg-config, and CMake's find_package) and runs both under mpirun with 2 ranks.
set -eu
BUILD=$1 SRC=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cmake --install "$BUILD" --prefix "$tmp/prefix" > "$tmp/install.log"
libdir=$(dirname "$(find "$tmp/prefix" -name zeroshard.pc)")/..
export PKG_CONFIG_PATH="$libdir/pkgconfig" LD_LIBRARY_PATH="$libdir"
cc -std=c17 -Wall -Wextra -Werror "$SRC/consumer.c" $(pkg-config --cflags --libs zeroshard) -o "$tmp/consumer_pc"
mpirun --oversubscribe -np 2 "$tmp/consumer_pc"
"$tmp/consumer_pc"    # a program run without mpirun is a world of one
cmake -S "$SRC" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/cmake.log"
cmake --build "$tmp/cmake" > "$tmp/cmake-build.log"
mpirun --oversubscribe -np 2 "$tmp/cmake/consumer_cmake"
echo "consumer: 3 passed, 0 failed"

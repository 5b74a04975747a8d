#!/usr/bin/env bash
# build.sh [BUILD_DIR] [cmake options...] - configures and builds ZeroShard (default dir: build); only the
# targets in ZS_BUILD_TARGETS (space-separated) when it is set.
set -eu
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZS_WERROR=ON "$@" > "$dir.cmake.log" 2>&1 || { cat "$dir.cmake.log"; exit 1; }
cmake --build "$dir" -j "$(nproc)" ${ZS_BUILD_TARGETS:+--target $ZS_BUILD_TARGETS}

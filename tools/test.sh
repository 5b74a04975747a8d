#!/usr/bin/env bash
# test.sh - builds ZeroShard and runs every test: once optimized, once under AddressSanitizer and
# UndefinedBehaviorSanitizer (ZS_TEST_SANITIZE=0 skips the second pass). Test-side packages first
# (tools/setup_tests.sh: torch for the parity test). A Release build (-O3, what a user's cmake gives) is built
# too, warnings as errors, since -O3 finds warnings the other two builds do not.
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
bash tools/setup_tests.sh
bash tools/build.sh build
ctest --test-dir build --output-on-failure -j 2
bash tools/build.sh build-release -DCMAKE_BUILD_TYPE=Release > /dev/null
if [ "${ZS_TEST_SANITIZE:-1}" != 0 ]; then
  bash tools/build.sh build-asan -DZS_SANITIZE=ON
  ctest --test-dir build-asan --output-on-failure -j 2
fi

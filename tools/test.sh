#!/usr/bin/env bash
# test.sh - builds ZeroShard and runs every test: once optimized, once under AddressSanitizer and
# UndefinedBehaviorSanitizer (ZS_TEST_SANITIZE=0 skips the second pass). Test-side packages first
# (tools/setup_tests.sh: torch for the parity test). A Release build (-O3, what a user's cmake gives: the
# library, its programs and examples; the tests are compiled with -Werror by the two builds that run them)
# and a clang build are made too, warnings as errors, since each finds warnings the other builds do not.
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
bash tools/setup_tests.sh
bash tools/build.sh build
ctest --test-dir build --output-on-failure -j 2
bash tools/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DZS_BUILD_TESTS=OFF > build-release.log 2>&1 || { tail -40 build-release.log; exit 1; }
if command -v clang > /dev/null; then # clang, warnings as errors: the library, examples and tools (the tests
  # use GCC's _Float16, which clang 14 lacks on x86-64; zs-train-gpt's vmath.c passes 64-byte GCC vectors
  # between helpers of its baseline x86-64 path, which clang 14 refuses without AVX512)
  CC=clang ZS_BUILD_TARGETS="zeroshard zeroshard_static zs-train-mlp zs-bench zs-ckpt zs-config-check \
zs-estimate zs-flight" bash tools/build.sh build-clang -DZS_CUDA=OFF > build-clang.log 2>&1 || { tail -40 build-clang.log; exit 1; }
fi
if [ "${ZS_TEST_SANITIZE:-1}" != 0 ]; then
  bash tools/build.sh build-asan -DZS_SANITIZE=ON
  ctest --test-dir build-asan --output-on-failure -j 2
fi

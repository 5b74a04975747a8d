#!/usr/bin/env bash
# test.sh - builds ZeroShard and runs every test: once optimized, once under AddressSanitizer and
# UndefinedBehaviorSanitizer (ZS_TEST_SANITIZE=0 skips the second pass). Test-side packages first
# (tools/setup_tests.sh: torch for the parity test). A Release build (-O3, what a user's cmake gives: the
# library, its programs and examples; the tests are compiled with -Werror by the two builds that run them)
# and a clang build are made too, warnings as errors, since each finds warnings the other builds do not.
# --no-build: only the two ctest passes, over the builds already in build and build-asan (tools/test_loaded.sh).
set -eu
cd "$(dirname "$0")/.."
build=1
[ "${1:-}" = --no-build ] && build=0
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if [ $build = 1 ]; then
  bash tools/setup_tests.sh
  bash tools/build.sh build
fi
# With the sanitizer pass to follow, the two passes share ckpt_publish's kills (each crash point once per run)
if [ "${ZS_TEST_SANITIZE:-1}" != 0 ]; then export ZS_TEST_KILLS=others; fi
ctest --test-dir build --output-on-failure -j 2
unset ZS_TEST_KILLS
if [ $build = 1 ]; then
  bash tools/build.sh build-release -DCMAKE_BUILD_TYPE=Release -DZS_BUILD_TESTS=OFF > build-release.log 2>&1 ||
    { tail -40 build-release.log; exit 1; }
  if command -v clang > /dev/null; then # clang, warnings as errors: the library, examples and tools (the tests
    # use GCC's _Float16, which clang 14 lacks on x86-64; zs-train-gpt's vmath.c passes 64-byte GCC vectors
    # between helpers of its baseline x86-64 path, which clang 14 refuses without AVX512)
    CC=clang ZS_BUILD_TARGETS="zeroshard zeroshard_static zs-train-mlp zs-bench zs-ckpt zs-config-check \
zs-estimate zs-flight" bash tools/build.sh build-clang -DZS_CUDA=OFF > build-clang.log 2>&1 ||
      { tail -40 build-clang.log; exit 1; }
  fi
fi
if [ "${ZS_TEST_SANITIZE:-1}" != 0 ]; then
  # The sanitizers see the host code: no CUDA kernels (the GPU tests skip without a GPU anyway, and nvcc's
  # device code is not instrumented); the CUDA paths still run here on the emulator (tests/cuda_emu). Left to
  # the optimized pass, whose C paths the runs here cover already: world-size invariance and the namespace
  # "nodes" (properties of the bits and of the network layout) and the one-rank oracle.
  [ $build = 0 ] || bash tools/build.sh build-asan -DZS_SANITIZE=ON -DZS_CUDA=OFF
  ctest --test-dir build-asan --output-on-failure -j 2 -E '^(det_world_mlp|det_world_gpt|netns|netns4|oracle_np1)$'
fi

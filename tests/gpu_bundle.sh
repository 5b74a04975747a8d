#!/usr/bin/env bash
# gpu_bundle.sh MODE BUILD_DIR BUNDLE - the bundle that tools/gpu_check.sh runs on a lent GPU machine.
#   pack:    tools/gpu_bundle.sh packs BUNDLE from BUILD_DIR, without DeepSpeed's wheels (a test fetches nothing;
#            skips, 77, where BUILD_DIR has no CUDA backend).
#   masked:  in a mount namespace where Debian's Open MPI, PMIx, hwloc, liburing, jansson, OpenBLAS, oneDNN and
#            every library the bundle carries are hidden (as on the lent image), the bundle's mpirun runs its
#            zs-train-mlp on 2 ranks to BUILD_DIR's params-hash, and gpu_check.sh prints every line, each GPU
#            line SKIP, and exits 77. Skips (77) without root or unshare.
#   fakegpu: with an nvidia-smi on PATH that lists a GPU (and none to run on), gpu_check.sh under a short
#            deadline prints the same lines, every GPU line FAIL (a SKIP with a GPU visible is a failure,
#            whether the CUDA runtime did not start or the deadline came), and exits 1; with its deadline
#            already past it starts no step and prints every line as a FAIL at the deadline.
set -u
MODE=$1 BUILD=$2 BUNDLE=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
. "$here/lib.sh"
skip() { echo "SKIP: $*"; exit 77; }
have_bundle() { [ -f "$BUNDLE/env.sh" ] || skip "no bundle at $BUNDLE (gpu_bundle_pack skipped or failed)"; }
# the lines gpu_check.sh printed: "NAME VERDICT" per check
verdicts() { sed -nE 's/^gpu_check: (.*[^ ]) +(PASS|FAIL|SKIP) \(.*/\1|\2/p' "$1"; }

# mask PATH...: hides each path that exists (a link's target) behind an empty folder or /dev/null
mask() {
  local p r
  for p in "$@"; do
    [ -e "$p" ] || continue
    r=$(readlink -f "$p")
    if [ -d "$r" ]; then mount --bind "$tmp/empty" "$r"; else mount --bind /dev/null "$r"; fi ||
      { echo "FAIL: cannot mask $r"; exit 1; }
  done
}

# inside the namespace: hide, then run from the bundle
masked_inside() {
  local L=/usr/lib/x86_64-linux-gnu f h rc
  mkdir -p "$tmp/empty"
  mask $L/openmpi $L/pmix2 $L/hwloc $L/openblas-pthread $L/blas $L/lapack /usr/share/openmpi /etc/openmpi
  mask $L/libhwloc* $L/liburing* $L/libjansson* $L/libopenblas* $L/libblas* $L/liblapack* $L/libmpi* $L/libopen-*
  mask $L/libevent* $L/libpmix* $L/libdnnl* $L/libgfortran* $L/libmunge*
  mask /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info
  for f in "$BUNDLE"/lib/*.so*; do f=${f##*/}; mask "$L/${f%.gz}"; done
  # the build's own program cannot start here: the mask holds
  "$BUILD/zs-train-mlp" --help > "$tmp/unmasked.out" 2>&1 && { echo "FAIL: the system's libraries are not hidden"; exit 1; }
  echo "masked: $(grep -m1 -oE 'lib[a-z_-]+\.so[.0-9]*[^ ]*' "$tmp/unmasked.out") ... ($BUILD/zs-train-mlp cannot start)"
  (
    . "$BUNDLE/env.sh"
    trap 'rm -rf "$ZS_BUNDLE_RUN"' EXIT
    r=bad
    [ "$(command -v mpirun)" = "$BUNDLE/bin/mpirun" ] && r=ok
    echo "mpirun is $(command -v mpirun): $r"; check $r "mpirun is not the bundle's"
    mpirun --oversubscribe -np 2 zs-train-mlp --config "$root/examples/configs/zero3.json" --steps 4 --quiet \
      > "$tmp/bundle.out" 2>&1 || run_failed "the bundle's mpirun: $(why_failed "$tmp/bundle.out")"
    h=$(awk '/^params-hash/ {print $2}' "$tmp/bundle.out")
    [ -n "$h" ] && [ "$h" = "$(cat "$tmp/hash")" ] && r=ok || r=bad
    echo "bundle's mpirun -np 2 zs-train-mlp: params-hash $h, the build's $(cat "$tmp/hash"): $r"
    check $r "the bundle's run differs from the build's: $(why_failed "$tmp/bundle.out")"
    echo "$pass $fail" > "$tmp/tally"
  )
  read -r pass fail < "$tmp/tally" || fail=$((fail + 1))
  OUT=$tmp/out bash "$root/tools/gpu_check.sh" "$BUNDLE" > "$tmp/check.out" 2>&1
  rc=$?
  cat "$tmp/check.out"
  verdicts "$tmp/check.out" > "$tmp/v"
  [ $rc -eq 77 ] && [ -s "$tmp/out/gpu_check.log" ] && ! grep -q '|FAIL' "$tmp/v" &&
    [ "$(grep -c '|SKIP' "$tmp/v")" -gt 10 ] && grep -q '^gpu_check: summary: ' "$tmp/check.out" && r=ok || r=bad
  echo "gpu_check.sh with no GPU: rc $rc, $(grep -c '|SKIP' "$tmp/v") SKIP, $(grep -c '|PASS' "$tmp/v") PASS: $r"
  check $r "gpu_check.sh from the masked bundle: want rc 77, no FAIL, every GPU line SKIP"
  finish gpu_bundle_masked
}

case $MODE in
  pack)
    readelf -S "$BUILD/libzeroshard.so" 2>/dev/null | grep -q nv_fatbin || skip "$BUILD has no CUDA backend (nvcc not found?)"
    bash "$root/tools/gpu_bundle.sh" "$BUNDLE" --from "$BUILD" --no-deepspeed; rc=$?
    [ $rc -eq 0 ] && [ -x "$BUNDLE/bin/mpirun" ] && [ -s "$BUNDLE/needs" ] && r=ok || r=bad
    check $r "tools/gpu_bundle.sh failed (rc $rc)"
    finish gpu_bundle_pack ;;
  masked)
    have_bundle
    [ "$(id -u)" -eq 0 ] || skip "not root: the mount namespace needs it"
    unshare -m true 2> "$tmp/err" || skip "unshare -m: $(cat "$tmp/err")"
    # the build's run, before anything is hidden, is what the bundle's must give
    mpirun --oversubscribe -np 2 "$BUILD/zs-train-mlp" --config "$root/examples/configs/zero3.json" --steps 4 --quiet \
      > "$tmp/build.out" 2>&1 || { echo "FAIL: the build's run: $(why_failed "$tmp/build.out")"; exit 1; }
    awk '/^params-hash/ {print $2}' "$tmp/build.out" > "$tmp/hash"
    export -f masked_inside mask verdicts check run_failed why_failed failed_runs finish
    export tmp BUILD BUNDLE root pass fail
    unshare -m bash -c masked_inside ;;
  fakegpu)
    have_bundle
    mkdir -p "$tmp/shim"
    printf '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-00000000-fake)"\n' > "$tmp/shim/nvidia-smi"
    chmod +x "$tmp/shim/nvidia-smi"
    OUT=$tmp/none bash "$root/tools/gpu_check.sh" "$BUNDLE" > "$tmp/none.out" 2>&1
    PATH=$tmp/shim:$PATH ZS_GPU_CHECK_DEADLINE=${ZS_TEST_DEADLINE:-20} OUT=$tmp/fake \
      bash "$root/tools/gpu_check.sh" "$BUNDLE" > "$tmp/fake.out" 2>&1
    rc=$?
    cat "$tmp/fake.out"
    verdicts "$tmp/none.out" | sed 's/|SKIP$/|FAIL/' > "$tmp/want"
    verdicts "$tmp/fake.out" > "$tmp/got"
    [ $rc -eq 1 ] && [ -s "$tmp/got" ] && cmp -s "$tmp/want" "$tmp/got" && grep -q ' 0 skipped' "$tmp/fake.out" &&
      [ -s "$tmp/fake/gpu_check.log" ] && r=ok || r=bad
    echo "gpu_check.sh with a GPU listed and none usable: rc $rc, $(grep -c '|FAIL' "$tmp/got") FAIL of $(wc -l < "$tmp/got") lines: $r"
    [ $r = ok ] || diff "$tmp/want" "$tmp/got"
    check $r "a SKIP with a GPU visible did not count as a FAIL (want rc 1 and the no-GPU run's SKIPs as FAILs)"
    # a deadline already past: no step starts, each line still printed and a FAIL naming the deadline
    PATH=$tmp/shim:$PATH ZS_GPU_CHECK_DEADLINE=0 OUT=$tmp/late bash "$root/tools/gpu_check.sh" "$BUNDLE" > "$tmp/late.out" 2>&1
    rc=$?
    n=$(grep -c 'FAIL (skipped with a GPU visible: deadline' "$tmp/late.out")
    [ $rc -eq 1 ] && [ "$n" -eq "$(wc -l < "$tmp/want")" ] && ! grep -q '^=== ' "$tmp/late/gpu_check.log" && r=ok || r=bad
    echo "gpu_check.sh past its deadline: rc $rc, $n of $(wc -l < "$tmp/want") lines FAIL at the deadline, none run: $r"
    [ $r = ok ] || cat "$tmp/late.out"
    check $r "past the deadline a step still started, or a line went missing"
    finish gpu_check_fakegpu ;;
  *) echo "usage: gpu_bundle.sh pack|masked|fakegpu BUILD_DIR BUNDLE" >&2; exit 2 ;;
esac

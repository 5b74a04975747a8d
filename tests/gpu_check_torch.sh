#!/usr/bin/env bash
# gpu_check_torch.sh LIBDIR - the GPU check's PyTorch stage (tools/gpu_check_torch.py) end to end with --device cpu:
# the package from python/, libzeroshard from LIBDIR, DeepSpeed left out. Checks that `all` prints a PASS line for
# each check (parity at 1 and 2 ranks, stages 0 and 3, stage 0 = stage 3 bits; tokens/s and memory against
# PyTorch; the ZeRO-Offload probe), SKIP lines for DeepSpeed, the digest, and its summary as the last line with
# the counts it printed, exit 0; and that a reference trained at another learning rate (10% off) makes the parity
# lines FAIL and the exit 1. Skips (77) when python3 cannot import torch and transformers.
set -u
LIBDIR=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
py_test_env gpu_check_torch "torch, transformers" "$LIBDIR"
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
tool=$here/../tools/gpu_check_torch.py

# verdict NAME PASS|FAIL|SKIP FILE: the check's line is there with that verdict
verdict() {
  local r=bad
  grep -q "^gpu_check_torch: $1: $2 " "$3" && r=ok
  echo "  $1: $2 $r"; check $r "$1: no $2 line"
}

python3 "$tool" all --device cpu --deepspeed off --scratch "$tmp/all" > "$tmp/all.out" 2>&1
rc=$?
grep '^gpu_check_torch:' "$tmp/all.out"
[ $rc -eq 0 ] && r=ok || r=bad
echo "all --device cpu: rc $rc: $r"; check $r "all --device cpu exited $rc (want 0)"
for n in 1 2; do
  for c in "stage 0" "stage 3" "stage 0 = stage 3"; do verdict "parity np$n $c" PASS "$tmp/all.out"; done
done
for c in "perf ZeroShard tokens/s" "perf ZeroShard memory" "offload ZeroShard"; do verdict "$c" PASS "$tmp/all.out"; done
for c in "perf DeepSpeed" "offload DeepSpeed"; do verdict "$c" SKIP "$tmp/all.out"; done
# the summary: the last line, its counts those of the lines above it
count() { grep -c "^gpu_check_torch: [^:]*: $1 " "$tmp/all.out"; }
last=$(tail -1 "$tmp/all.out")
want="$(count PASS) passed, $(count FAIL) failed, $(count SKIP) skipped"
[[ $last =~ ^gpu_check_torch:\ summary:\ ([0-9]+\ passed,\ [0-9]+\ failed,\ [0-9]+\ skipped)\ in\ [0-9]+\ s$ ]] &&
  [ "${BASH_REMATCH[1]}" = "$want" ] && [ "$want" = "9 passed, 0 failed, 2 skipped" ] && r=ok || r=bad
echo "last line '$last', counted $want: $r"; check $r "the summary is not the last line or its counts are off"
grep -q '^gpu_check_torch: result: parity np1 bf16: ' "$tmp/all.out" && r=ok || r=bad
echo "digest line: $r"; check $r "no 'result:' digest line"

# the comparison can fail: the reference at a learning rate 10% off
python3 "$tool" parity --ranks 1 --device cpu --ref-lr 3.3e-4 --scratch "$tmp/broken" > "$tmp/broken.out" 2>&1
rc=$?
grep '^gpu_check_torch:' "$tmp/broken.out"
[ $rc -eq 1 ] && r=ok || r=bad
echo "parity with the reference's lr 10% off: rc $rc: $r"; check $r "a reference at another lr did not fail (rc $rc)"
verdict "parity np1 stage 0" FAIL "$tmp/broken.out"
verdict "parity np1 stage 3" FAIL "$tmp/broken.out"
verdict "parity np1 stage 0 = stage 3" PASS "$tmp/broken.out"
finish gpu_check_torch

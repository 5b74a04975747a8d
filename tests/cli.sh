#!/usr/bin/env bash
# cli.sh TRAIN CONFIGS - the example's command line as scripts use it: shipped configs train and agree,
# the loss falls, --memory-json prints one line per rank, and bad input gives one
# "zeroshard: error:" line naming the key or rank with a non-zero exit.
set -u
TRAIN=$1 CONFIGS=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pass=0 fail=0
check() { if [ "$1" = ok ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }
mpi() { mpirun --oversubscribe "$@"; }

# shipped configs: all four stages give the same parameters
hashes=""
for s in 0 1 2 3; do
  out=$(mpi -np 2 "$TRAIN" --config "$CONFIGS/zero$s.json" --steps 40 --seed 5 2>&1)
  rc=$?
  h=$(echo "$out" | awk '/^params-hash/ {print $2}')
  first=$(echo "$out" | awk '/^step 1 loss/ {print $4}')
  last=$(echo "$out" | awk '/^step 40 loss/ {print $4}')
  echo "zero$s.json: rc $rc loss $first -> $last params-hash $h"
  [ $rc -eq 0 ] && [ -n "$h" ] && r=ok || r=bad; check $r "zero$s.json did not train: $out"
  awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < 0.6 * a)}' && r=ok || r=bad
  check $r "zero$s.json: loss did not fall enough ($first -> $last)"
  [ "$(echo "$out" | tail -n 1 | cut -d' ' -f1)" = params-hash ] && r=ok || r=bad
  check $r "zero$s.json: last line is not params-hash"
  hashes="$hashes $h"
done
[ "$(echo $hashes | tr ' ' '\n' | sort -u | wc -l)" = 1 ] && r=ok || r=bad
check $r "shipped configs disagree: $hashes"

# the kernel path and the thread count never change a bit (units above the pool's parallel threshold)
ref=""
for env in "ZS_KERNEL=scalar ZS_THREADS=1" "ZS_KERNEL=auto ZS_THREADS=1" "ZS_KERNEL=auto ZS_THREADS=2" "ZS_KERNEL=scalar ZS_THREADS=3"; do
  out=$(env $env mpirun --oversubscribe -np 2 -x ZS_KERNEL -x ZS_THREADS "$TRAIN" --config "$CONFIGS/zero2.json" \
        --steps 5 --hidden 256 2>&1); rc=$?
  h=$(echo "$out" | awk '/^params-hash/ {print $2}')
  echo "$env: rc $rc params-hash $h"
  [ -z "$ref" ] && [ $rc -eq 0 ] && ref=$h
  [ $rc -eq 0 ] && [ -n "$h" ] && [ "$h" = "$ref" ] && r=ok || r=bad; check $r "$env: rc $rc, $h vs $ref: $out"
done
out=$(ZS_KERNEL=sse mpirun --oversubscribe -np 1 -x ZS_KERNEL "$TRAIN" --config "$CONFIGS/zero2.json" 2>&1 >/dev/null)
echo "$out" | grep -q "^zeroshard: error: .*ZS_KERNEL: unknown kernel path 'sse'" && r=ok || r=bad
check $r "bad ZS_KERNEL: $out"

# --memory-json: one line per rank, stage 3 shards parameters
out=$(mpi -np 3 "$TRAIN" --config "$CONFIGS/zero3.json" --steps 1 --memory-json 2>&1)
n=$(echo "$out" | grep -c '^{"memory": {"rank": [0-9]*, "stage": 3, "world": 3, "params": ')
[ "$n" = 3 ] && r=ok || r=bad; check $r "--memory-json printed $n lines: $out"

# a bad config: one error line naming the key, non-zero exit
cat > "$tmp/bad.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2, "stage3_param_persitance_threshold": 10}}
JSON
out=$(mpi -np 2 "$TRAIN" --config "$tmp/bad.json" --steps 1 2>&1 >/dev/null); rc=$?
echo "bad config: rc $rc: $out"
lines=$(echo "$out" | grep -c '^zeroshard: error: .*zero_optimization.stage3_param_persitance_threshold')
[ $rc -ne 0 ] && [ "$lines" = 1 ] && r=ok || r=bad; check $r "bad config: rc $rc, output: $out"

# a rank with a different config: the error names the rank (two programs under one mpirun)
sed 's/"stage": 2/"stage": 3/' "$CONFIGS/zero2.json" > "$tmp/other.json"
out=$(mpi -np 2 "$TRAIN" --config "$CONFIGS/zero2.json" --steps 1 : -np 1 "$TRAIN" --config "$tmp/other.json" --steps 1 \
      2>&1 >/dev/null); rc=$?
echo "mismatched rank: rc $rc: $out"
echo "$out" | grep -q '^zeroshard: error: .*config differs between ranks: rank(s) 2 .*zero_optimization.stage 2 vs 3' \
  && [ $rc -ne 0 ] && r=ok || r=bad
check $r "mismatched rank: $out"

# a device memory budget the stage does not fit: one line that names what would fit; that setting trains
out=$(ZS_DEVICE_MEMORY=50K mpirun --oversubscribe -np 2 -x ZS_DEVICE_MEMORY "$TRAIN" --config "$CONFIGS/zero0.json" \
      --steps 1 2>&1 >/dev/null); rc=$?
echo "budget: rc $rc: $(echo "$out" | grep '^zeroshard')"
echo "$out" | grep -q "^zeroshard: error: .*out of device memory: stage 0 needs .* the budget is 50.0 KiB; stage 1 with offload_optimizer cpu would need" \
  && [ $rc -ne 0 ] && r=ok || r=bad
check $r "device budget: $out"
sed 's/"stage": 1,/"stage": 1, "offload_optimizer": {"device": "cpu"},/' "$CONFIGS/zero1.json" > "$tmp/off1.json"
out=$(ZS_DEVICE_MEMORY=50K mpirun --oversubscribe -np 2 -x ZS_DEVICE_MEMORY "$TRAIN" --config "$tmp/off1.json" --steps 3 \
      --memory-json 2>&1); rc=$?
echo "$out" | grep -q '"host": [1-9]' && echo "$out" | grep -q '^params-hash' && [ $rc -eq 0 ] && r=ok || r=bad
check $r "offloaded stage 1 within the budget: $out"

# NVMe offload with a nvme_path that does not exist: the error names the key and the path
sed 's/"stage": 1,/"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "\/nonexistent\/zs"},/' \
    "$CONFIGS/zero1.json" > "$tmp/nvme_missing.json"
out=$(mpirun --oversubscribe -np 2 "$TRAIN" --config "$tmp/nvme_missing.json" --steps 1 2>&1 >/dev/null); rc=$?
echo "nvme_path missing: rc $rc: $(echo "$out" | grep '^zeroshard')"
echo "$out" | grep -q "^zeroshard: error: .*offload_optimizer.nvme_path: .*/nonexistent/zs" && [ $rc -ne 0 ] && r=ok || r=bad
check $r "missing nvme_path: $out"

# NVMe faults, injected through the swapper's test hook: a full disk while the state file is laid out
# (caught at set-up on every rank) and a failing read in the middle of a step: one error line naming the
# file, the offset and the errno, a non-zero exit, no hang, and no directory left behind at set-up.
nv=$(mktemp -d -p "$PWD")
sed 's|"stage": 1,|"stage": 1, "sub_group_size": 2000, "offload_optimizer": {"device": "nvme", "nvme_path": "'"$nv"'"},|' \
    "$CONFIGS/zero1.json" > "$tmp/nvme.json"
out=$(mpirun --oversubscribe -np 2 "$TRAIN" --config "$tmp/nvme.json" --steps 3 2>&1); rc=$?
echo "$out" | grep -q '^params-hash' && [ $rc -eq 0 ] && r=ok || r=bad; check $r "nvme offload run: $out"
for fault in "write:ENOSPC:0" "read:EIO:0"; do
  out=$(ZS_TEST_SWAP_FAULT=$fault timeout 120 mpirun --oversubscribe -np 2 -x ZS_TEST_SWAP_FAULT "$TRAIN" \
        --config "$tmp/nvme.json" --steps 3 2>&1 >/dev/null); rc=$?
  line=$(echo "$out" | grep '^zeroshard: error:' | head -1)
  echo "fault $fault: rc $rc: $line"
  err=$([ "${fault%%:*}" = write ] && echo "No space left on device" || echo "Input/output error")
  echo "$line" | grep -q "optimizer.swap: ${fault%%:*} at offset 0 .*$err" && [ $rc -ne 0 ] && [ $rc -ne 124 ] \
    && r=ok || r=bad
  check $r "fault $fault: rc $rc: $out"
done
# A swap read that never completes (a hung disk) ends within ZS_TIMEOUT in one named error
# (a directory of its own: the aborted runs above may leave theirs to an owner still exiting)
nvh=$(mktemp -d -p "$PWD")
sed "s|$nv|$nvh|" "$tmp/nvme.json" > "$tmp/nvme_hang.json"
out=$(ZS_TIMEOUT=3 ZS_TEST_SWAP_FAULT=read:HANG:0 timeout 120 mpirun --oversubscribe -np 2 -x ZS_TIMEOUT \
      -x ZS_TEST_SWAP_FAULT "$TRAIN" --config "$tmp/nvme_hang.json" --steps 3 2>&1 >/dev/null); rc=$?
line=$(echo "$out" | grep '^zeroshard: error:' | head -1)
echo "fault read:HANG:0: rc $rc: $line"
echo "$line" | grep -q "optimizer.swap: timeout: read at offset 0 (.* bytes) did not complete in .* (zeroshard.timeout_s / ZS_TIMEOUT = 3)" \
  && [ $rc -ne 0 ] && [ $rc -ne 124 ] && r=ok || r=bad
check $r "fault read:HANG:0: rc $rc: $out"
rm -rf "$nv" "$nvh"

# the GPU asked for where it cannot run (no CUDA backend built, no GPU visible; with one, this example, whose
# program touches the engine's buffers on the host): refused, naming the key
sed 's/"zero_optimization"/"zeroshard": {"device": "cuda"}, "zero_optimization"/' "$CONFIGS/zero1.json" > "$tmp/cuda.json"
out=$(mpi -np 2 "$TRAIN" --config "$tmp/cuda.json" --steps 1 2>&1 >/dev/null); rc=$?
echo "device cuda: $(echo "$out" | grep '^zeroshard: error:' | head -1)"
echo "$out" | grep -q '^zeroshard: error: .*zeroshard.device: "cuda": ' && [ $rc -ne 0 ] && r=ok || r=bad
check $r "zeroshard.device cuda not refused by name (rc $rc): $out"

# missing file, missing --config
out=$(mpi -np 1 "$TRAIN" --config "$tmp/nope.json" 2>&1 >/dev/null); rc=$?
echo "$out" | grep -q "^zeroshard: error: .*nope.json: cannot read config" && [ $rc -ne 0 ] && r=ok || r=bad
check $r "missing file: $out"
out=$(mpi -np 1 "$TRAIN" 2>&1 >/dev/null); rc=$?
echo "$out" | grep -q "^zeroshard: error: --config FILE is required" && [ $rc -ne 0 ] && r=ok || r=bad
check $r "missing --config: $out"
echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]

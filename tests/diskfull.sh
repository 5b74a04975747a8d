#!/usr/bin/env bash
# diskfull.sh TRAIN - a real full file system (a 6 MiB tmpfs) under the NVMe swap files and under the
# checkpoint directory: each run must stop with a one-line error naming the file, exit non-zero without
# hanging, leave no swap files behind, and leave the previous checkpoint loadable. Needs root and
# mount(2) (exit 77, a skip, where the container refuses it).
set -u
TRAIN=$1
tmp=$(mktemp -d)
mnt=$tmp/small
mkdir -p "$mnt"
if ! mount -t tmpfs -o size=6m tmpfs "$mnt" 2> /dev/null; then
  echo "diskfull: skipped: cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)"
  rm -rf "$tmp"
  exit 77
fi
trap 'umount "$mnt"; rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pass=0 fail=0
check() { if [ "$1" = ok ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }

cat > "$tmp/nvme.json" <<JSON
{"train_batch_size": 8, "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
   "offload_optimizer": {"device": "nvme", "nvme_path": "$mnt"}, "offload_param": {"device": "nvme", "nvme_path": "$mnt"}}}
JSON
cat > "$tmp/plain.json" <<JSON
{"train_batch_size": 8, "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": 2}}
JSON

# 1. swap files that cannot fit: 2 ranks x (parameters + Adam state) of a 1.1M-parameter model > 6 MiB
out=$(timeout 120 mpirun --oversubscribe -np 2 "$TRAIN" --config "$tmp/nvme.json" --steps 2 --hidden 512 --layers 4 \
      --quiet 2>&1); rc=$?
msg=$(echo "$out" | grep -m1 "error:")
[ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$msg" | grep -q "optimizer.swap" && echo "$msg" | grep -qi "space" && r=ok || r=bad
echo "swap on a full disk: rc $rc: $msg $r"; check $r "swap on a full disk: rc $rc, output: $out"
left=$(find "$mnt" -mindepth 1 | wc -l)
[ "$left" = 0 ] && r=ok || r=bad; check $r "the failed run left $left entries in $mnt"

# 2. a checkpoint that cannot fit: the save fails naming its file; the earlier checkpoint stays whole
mpirun --oversubscribe -np 2 "$TRAIN" --config "$tmp/plain.json" --steps 2 --hidden 64 --quiet --save-dir "$mnt/ck" \
  > /dev/null 2>&1 && r=ok || r=bad
check $r "a small checkpoint should fit"
head -c $((5 * 1024 * 1024)) /dev/zero > "$mnt/filler" 2> /dev/null # leave well under what the next save needs
out=$(timeout 120 mpirun --oversubscribe -np 2 "$TRAIN" --config "$tmp/plain.json" --steps 4 --hidden 512 --quiet \
      --save-dir "$mnt/ck2" 2>&1); rc=$?
msg=$(echo "$out" | grep -m1 "error:")
[ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$msg" | grep -q "rank0000[01].bin\|manifest.json" && r=ok || r=bad
echo "checkpoint on a full disk: rc $rc: $msg $r"; check $r "checkpoint on a full disk: rc $rc, output: $out"
[ "$(cat "$mnt/ck/latest")" = global_step2 ] && r=ok || r=bad; check $r "the earlier checkpoint's latest changed"
left=$(ls -A "$mnt/ck2" 2> /dev/null | grep -v -x save.lock | tr '\n' ' ') # a failed save leaves no <tag>.tmp
[ -z "$left" ] && r=ok || r=bad
echo "the failed save left in its directory: '${left}' $r"; check $r "the failed save left $left in $mnt/ck2"
rm -f "$mnt/filler"
out=$(mpirun --oversubscribe -np 2 "$TRAIN" --config "$tmp/plain.json" --steps 2 --hidden 64 --quiet --load "$mnt/ck" 2>&1)
[ $? = 0 ] && r=ok || r=bad; check $r "the earlier checkpoint no longer loads: $out"

echo "diskfull: $pass passed, $fail failed"
[ $fail -eq 0 ]

#!/usr/bin/env bash
# swap_owner_reused.sh TRAIN - a swap directory whose owner record names a pid that a newer process now has:
# the record's start time is older than the live process's, as real pid reuse leaves it (a pid is only
# reused after its first owner has exited). The recorded run is dead, so the directory is stale: taken over,
# trained in and removed at the end, while the process that has the pid now is left alone.
set -u
TRAIN=$1
source "$(dirname "$0")/lib.sh"
nvme=$tmp/nvme
mkdir -p "$nvme/zeroshard-rank0" && chmod 700 "$nvme/zeroshard-rank0"
cat > "$tmp/nvme.json" <<JSON
{"train_batch_size": 4, "steps_per_print": 0, "optimizer": {"type": "Adam", "params": {"lr": 0.02}},
 "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "nvme", "nvme_path": "$nvme"}}}
JSON
sleep 600 &
now=$!
trap 'kill $now 2> /dev/null; rm -rf "$tmp"' EXIT
started=$(sed 's/.*) //' "/proc/$now/stat" | cut -d' ' -f20) # field 22 of stat: start time, in ticks after boot
{
  echo "zeroshard-owner 1"
  echo "host $(hostname)"
  echo "boot $(cat /proc/sys/kernel/random/boot_id)"
  echo "pidns $(readlink /proc/self/ns/pid)"
  echo "pid $now"
  echo "start $((started - 1))" # the run that had this pid before the sleeper started
} > "$nvme/zeroshard-rank0/owner"
echo "the dead run's state" > "$nvme/zeroshard-rank0/optimizer.swap"

out=$(timeout 120 "$TRAIN" --config "$tmp/nvme.json" --steps 1 --hidden 32 2>&1); rc=$?
echo "an owner record of a reused pid: rc $rc: $(echo "$out" | grep -m1 -e "stale directory" -e "error:")"
[ $rc -eq 0 ] && echo "$out" | grep -q "a stale directory from a dead run was cleared" && r=ok || r=bad
check $r "a directory whose recorded pid was reused was not taken over: rc $rc: $out"
[ ! -e "$nvme/zeroshard-rank0" ] && r=ok || r=bad
check $r "the run left its swap directory behind: $(ls -A "$nvme/zeroshard-rank0" 2>&1 | tr '\n' ' ')"
kill -0 $now 2> /dev/null && r=ok || r=bad
check $r "the process that has the pid now did not survive the run"
finish swap_owner_reused

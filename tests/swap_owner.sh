#!/usr/bin/env bash
# swap_owner.sh TRAIN - the swap directory's owner through the whole program: a run refused at NVMe set-up
# because another run holds its swap directory must leave that run's files alone, and a directory whose
# recorded owner is gone is taken over and removed at the end. The live owner is a sleeping child whose
# record (host, boot id, pid namespace, pid, start time) is written here as the other run would.
set -u
TRAIN=$1
source "$(dirname "$0")/lib.sh"
nvme=$tmp/nvme
dir=$nvme/zeroshard-rank0
mkdir -p "$dir" && chmod 700 "$dir"
cat > "$tmp/nvme.json" <<JSON
{"train_batch_size": 8, "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "$nvme"}}}
JSON
record() { # pid start: the owner record of pid on this host and boot
  printf 'zeroshard-owner 1\nhost %s\nboot %s\npidns %s\npid %s\nstart %s\n' "$(hostname)" \
    "$(cat /proc/sys/kernel/random/boot_id)" "$(readlink /proc/self/ns/pid)" "$1" "$2"
}
sleep 600 &
owner=$!
trap 'kill $owner 2> /dev/null; rm -rf "$tmp"' EXIT
start=$(sed 's/.*) //' "/proc/$owner/stat" | cut -d' ' -f20) # field 22, counted after the name
record "$owner" "$start" > "$dir/owner"
echo "the live run's state" > "$dir/optimizer.swap"

# 1. refused: the error names the owner, and every file of the live run survives
out=$(timeout 120 "$TRAIN" --config "$tmp/nvme.json" --steps 1 --hidden 64 --quiet 2>&1); rc=$?
msg=$(echo "$out" | grep -m1 "error:")
echo "refused run: rc $rc: $msg"
[ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$msg" | grep -q "in use by pid $owner" && r=ok || r=bad
check $r "a run on a held directory was not refused by name: rc $rc: $out"
[ -f "$dir/owner" ] && [ -f "$dir/optimizer.swap" ] && r=ok || r=bad
check $r "the refused run removed the live run's files: $(ls -A "$dir" 2>&1 | tr '\n' ' ')"
[ "$(sed -n 5p "$dir/owner")" = "pid $owner" ] && r=ok || r=bad
check $r "the live run's owner record changed: $(cat "$dir/owner" 2>&1)"

# 2. the owner gone (same pid record, process dead): taken over, trained, removed at exit
kill $owner; wait $owner 2> /dev/null
out=$(timeout 120 "$TRAIN" --config "$tmp/nvme.json" --steps 1 --hidden 64 2>&1); rc=$?
echo "after the owner died: rc $rc: $(echo "$out" | grep -m1 "optimizer state on NVMe")"
[ $rc -eq 0 ] && echo "$out" | grep -q "a stale directory from a dead run was cleared" && r=ok || r=bad
check $r "a dead owner's directory was not taken over: rc $rc: $out"
[ ! -e "$dir" ] && r=ok || r=bad; check $r "the run left $dir behind"
finish swap_owner

#!/usr/bin/env bash
# ckpt_publish_undo.sh TRAIN ZS_CKPT - a tag saved again by the fallback for file systems without
# RENAME_EXCHANGE (ZS_TEST_CKPT_NO_EXCHANGE) that fails twice: a hard link fails once `latest` names
# <tag>.tmp, and the undo then cannot point `latest` back. `latest` stays on <tag>.tmp, so the failed save
# must leave that directory in place: it verifies and loads as the new checkpoint, and the next save
# finishes the job. Both failures are real ones, set up while the save is paused before its first link
# (ZS_TEST_CKPT_FAULT=0:stop:K): a file in the link's way, and a directory where `latest`'s new copy goes.
set -u
TRAIN=$1 ZS=$2
. "$(dirname "$0")/lib.sh"

cat > "$tmp/c.json" <<JSON
{"train_batch_size": 4, "steps_per_print": 0, "zero_optimization": {"stage": 1},
 "optimizer": {"type": "Adam", "params": {"lr": 0.02}}}
JSON
export ZS_TEST_CKPT_NO_EXCHANGE=1 ZS_TEST_CKPT_TRACE= ZS_TEST_CKPT_FAULT=
# save SEED DIR [ARGS...] -> the program's output; two steps, so the tag is global_step2
save() {
  local seed=$1 dir=$2
  shift 2
  mpirun --oversubscribe -np 1 -x ZS_TEST_CKPT_NO_EXCHANGE -x ZS_TEST_CKPT_TRACE -x ZS_TEST_CKPT_FAULT "$TRAIN" \
    --config "$tmp/c.json" --steps 2 --hidden 16 --quiet --seed "$seed" ${dir:+--save-dir "$dir"} "$@" 2>&1
}
params_hash() { awk '/^params-hash/ {print $2}'; }
# the params-hash DIR's `latest` loads to, or FAILED
hash_loaded() { local h; h=$(ZS_TEST_CKPT_FAULT= save 1 "" --load "$1" | params_hash); echo "${h:-FAILED}"; }

old=$(save 5 "$tmp/ck" | params_hash)
new=$(save 6 "" | params_hash)
[ -n "$old" ] && [ -n "$new" ] && [ "$old" != "$new" ] && r=ok || r=bad
check $r "set-up: seed 5 saved $old, seed 6 trains to $new"

# The step numbers of a re-save by links, traced on a copy: K is the first link.
cp -r "$tmp/ck" "$tmp/traced"
ZS_TEST_CKPT_TRACE=$tmp/trace save 6 "$tmp/traced" > /dev/null
k=$(grep -n -m1 '^0 link ' "$tmp/trace" | cut -d: -f1)
[ -n "$k" ] && r=ok || r=bad
check $r "no link step in the trace of a re-save by links: $(cat "$tmp/trace" 2> /dev/null)"

ZS_TEST_CKPT_FAULT=0:stop:${k:-1} save 6 "$tmp/ck" > "$tmp/failed.out" &
job=$!
pid=""
for _ in $(seq 300); do # the rank under this job's mpirun, once it has stopped itself
  pid=$(ps -e -o pid=,ppid=,stat= | awk -v top=$job '{ up[$1] = $2; st[$1] = $3 }
    END { for (p in up) if (st[p] ~ /^T/) {
            q = p; while ((q in up) && q != top && q > 1) q = up[q]
            if (q == top) print p } }')
  [ -n "$pid" ] && break
  sleep 0.1
done
for f in "$tmp"/ck/global_step2.tmp/*; do # the first failure: every link finds its name taken
  : > "$tmp/ck/global_step2/${f##*/}"
done
mkdir -p "$tmp/ck/latest.tmp/in-the-way" # the second: the undo cannot write `latest` again
[ -n "$pid" ] && kill -CONT $pid
wait $job; rc=$?
latest=$(cat "$tmp/ck/latest" 2> /dev/null)
v=$("$ZS" verify "$tmp/ck" 2>&1); vrc=$?
h=$(hash_loaded "$tmp/ck")
echo "a re-save failing at a link and again in its undo: rc $rc ($(grep -m1 'error:' "$tmp/failed.out")), latest" \
  "'$latest', verify rc $vrc, loads as $h"
[ -n "$pid" ] && [ $rc != 0 ] && [ "$latest" = global_step2.tmp ] && [ -d "$tmp/ck/global_step2.tmp" ] &&
  [ $vrc = 0 ] && [ "$h" = "$new" ] && r=ok || r=bad
check $r "latest '$latest' must name a kept global_step2.tmp that loads as $new: left $(ls "$tmp/ck" | tr '\n' ' ');
verify: $v; the save: $(cat "$tmp/failed.out")"

# The next save, once nothing is in the way, finishes the interrupted publish and leaves only the tag.
rm -rf "$tmp/ck/latest.tmp"
out=$(save 6 "$tmp/ck"); rc=$?
left=$(ls "$tmp/ck" | tr '\n' ' ')
[ $rc = 0 ] && [ "$left" = "global_step2 latest save.lock " ] && [ "$(hash_loaded "$tmp/ck")" = "$new" ] &&
  r=ok || r=bad
echo "the next save: rc $rc, left $left $r"
check $r "the save after the double failure: rc $rc, left $left: $out"
finish ckpt_publish_undo

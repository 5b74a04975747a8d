#!/usr/bin/env bash
# ckpt_publish.sh TRAIN ZS_CKPT - what a save does to its directory, through the test hooks of
# ckpt/ckpt_dir.c (ZS_TEST_CKPT_TRACE: each step's name, in order; ZS_TEST_CKPT_FAULT=RANK:ACTION:K:
# kill, stop or fail that rank's K-th step, or fail a data file's write with ENOSPC;
# ZS_TEST_CKPT_NO_EXCHANGE: the fallback for file systems without RENAME_EXCHANGE):
#  crash:       a tag saved again, killed before each step of the publish, or with that step failing, with
#               both ways of replacing the tag: `latest` names a checkpoint that verifies and loads, and
#               the next save finishes cleanly;
#  links:       a <tag>.tmp (and <tag>.old) that is a link to another directory is removed as a link:
#               the other directory's files survive the save;
#  two jobs:    a second job saving into a directory that a paused job is saving into fails naming the
#               first job's host and pid, and leaves its files alone; the first job then finishes;
#  full disk:   a save that fails on a full disk leaves no <tag>.tmp, and the previous checkpoint loads;
#  fsync order: the order of renames and fsyncs: a new save directory is fsynced in its parent, the new
#               <tag>.tmp in the save directory before files go in, and the save directory between the
#               tag's rename and the rename of `latest`, and after it.
set -u
TRAIN=$1 ZS=$2
. "$(dirname "$0")/lib.sh"

cat > "$tmp/c.json" <<JSON
{"train_batch_size": 8, "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": 2}}
JSON
export ZS_TEST_CKPT_TRACE= ZS_TEST_CKPT_FAULT= ZS_TEST_CKPT_NO_EXCHANGE=
# run NP ARGS... -> the program's output (stdout and stderr); two steps, so a run saves global_step2
run() {
  local np=$1
  shift
  mpirun --oversubscribe -np "$np" -x ZS_TEST_CKPT_TRACE -x ZS_TEST_CKPT_FAULT -x ZS_TEST_CKPT_NO_EXCHANGE "$TRAIN" \
    --config "$tmp/c.json" --steps 2 --hidden 24 --quiet "$@" 2>&1
}
hash_of() { awk '/^params-hash/ {print $2}'; }
# loads DIR: its params-hash, or FAILED
loaded() { local h; h=$(ZS_TEST_CKPT_FAULT= ZS_TEST_CKPT_TRACE= run 1 --load "$1" | hash_of); echo "${h:-FAILED}"; }
fresh() { rm -rf "$tmp/ck"; cp -r "$tmp/base" "$tmp/ck"; } # ck: global_step2 of seed 5, `latest` on it

old=$(run 1 --seed 5 --save-dir "$tmp/base" | hash_of)
new=$(run 1 --seed 6 --save-dir "$tmp/newck" | hash_of)
[ -n "$old" ] && [ -n "$new" ] && [ "$old" != "$new" ] && r=ok || r=bad
check $r "set-up runs: seed 5 $old, seed 6 $new"

# ---------------------------------------------------------------- fsync order: the order of the steps
# order TRACE DIR PARENT: "ok", or the first step out of order
order() {
  awk -v D="$2" -v P="$3" '
    function out(msg) { print msg; bad = 1; exit }
    { step = $2 " " $3 (NF > 3 ? " " $4 : "") }
    parent { if (step != "fsync " P) out("mkdir " D " not followed by fsync " P ", but by: " step); parent = 0 }
    $2 == "mkdir" && $3 == D { parent = 1; next }
    $2 == "fsync" && $3 == D { moved = ""; made = 0; pending = 0; next }
    $2 == "write" && made && index($3, D "/") == 1 && $3 !~ "/latest.tmp$" {
      out("wrote " $3 " before fsync " D " made its new directory durable") }
    $2 == "rename" && $4 == D "/latest" { if (moved != "") out("latest renamed before fsync " D " after: " moved); pending = 1; lat = 1; next }
    $2 == "mkdir" { made = 1 }
    $2 == "rename" || $2 == "exchange" || $2 == "mkdir" { moved = step }
    $2 == "rename" || $2 == "exchange" || $2 == "mkdir" { tag = tag || $NF == D "/global_step2" }
    END {
      if (bad) exit
      if (!tag || !lat) print "no rename of the tag and of latest traced"
      else if (pending) print "no fsync " D " after the last rename of latest"
      else print "ok"
    }
  ' "$1"
}
for mode in new exchange links; do
  [ $mode = links ] && export ZS_TEST_CKPT_NO_EXCHANGE=1 || export ZS_TEST_CKPT_NO_EXCHANGE=
  rm -rf "$tmp/fresh" "$tmp/trace.$mode"; mkdir "$tmp/fresh"; fresh
  [ $mode = new ] && d=$tmp/fresh/ck || d=$tmp/ck
  ZS_TEST_CKPT_TRACE=$tmp/trace.$mode run 1 --seed 6 --save-dir "$d" > /dev/null
  res=$(order "$tmp/trace.$mode" "$d" "$(dirname "$d")")
  [ "$res" = ok ] && [ "$(loaded "$d")" = "$new" ] && r=ok || r=bad
  echo "fsync order of a $mode save ($(wc -l < "$tmp/trace.$mode") steps): $res $r"
  check $r "fsync order: $mode save: $res; trace: $(cat "$tmp/trace.$mode")"
done
export ZS_TEST_CKPT_NO_EXCHANGE=

# ---------------------------------------------------------------- crash: a crash or a failure at each step
# For each step from the data file's write on (earlier ones are the crash mid-save of ckpt.sh): kill the
# save before it, or make it fail. `latest` must name a checkpoint that verifies and loads (the old or the
# new one); a failed save leaves no temporary directory that `latest` does not name; after a kill, the
# next save finishes and leaves only the tag.
for mode in exchange links; do
  [ $mode = links ] && export ZS_TEST_CKPT_NO_EXCHANGE=1 || export ZS_TEST_CKPT_NO_EXCHANGE=
  # the steps the two ways share are tried once
  [ $mode = exchange ] && first=$(grep -n ' write .*/rank00000.bin$' "$tmp/trace.$mode" | cut -d: -f1) ||
    first=$(grep -n -m1 ' write .*/latest.tmp$' "$tmp/trace.$mode" | cut -d: -f1)
  total=$(wc -l < "$tmp/trace.$mode")
  bad=0
  [ -n "$first" ] || { first=1 total=0 bad=1; echo "crash: $mode: no trace of the save's steps" >&2; }
  for k in $(seq "$first" "$total"); do
    step=$(sed -n "${k}p" "$tmp/trace.$mode" | cut -d' ' -f2-)
    for action in kill fail; do
      [ $action = fail ] && case "$step" in remove*) continue;; esac # best effort: a failure changes nothing
      # ZS_TEST_KILLS shares the kills between the CI's two passes (tools/test.sh), so each step is killed
      # once per CI run: "third" (the sanitizer pass) at every third step, "others" at the rest; unset, every
      # step. A kill's recovery is one code path, while each failure unwinds from its own step.
      if [ $action = kill ] && [ -n "${ZS_TEST_KILLS:-}" ]; then
        third=$(( (k - first) % 3 ))
        [ "$ZS_TEST_KILLS" = others ] && [ $third = 0 ] && continue
        [ "$ZS_TEST_KILLS" = third ] && [ $third != 0 ] && continue
      fi
      fresh
      out=$(ZS_TEST_CKPT_FAULT=0:$action:$k run 1 --seed 6 --save-dir "$tmp/ck"); rc=$?
      v=$("$ZS" verify "$tmp/ck" 2>&1); vrc=$?
      latest=$(cat "$tmp/ck/latest" 2> /dev/null)
      if [ $action = kill ]; then
        h=$(loaded "$tmp/ck")
      else # a verified copy of the old or the new data loads as they do (the kills load for real)
        h=FAILED
        cmp -s "$tmp/ck/$latest/rank00000.bin" "$tmp/base/global_step2/rank00000.bin" && h=$old
        cmp -s "$tmp/ck/$latest/rank00000.bin" "$tmp/newck/global_step2/rank00000.bin" && h=$new
      fi
      left=$(ls "$tmp/ck" | grep -v -x -e global_step2 -e latest -e save.lock -e "$latest" | tr '\n' ' ')
      why=""
      [ $vrc = 0 ] || why="verify: $v"
      [ "$h" = "$old" ] || [ "$h" = "$new" ] || why="$why; loads as $h (old $old, new $new)"
      [ $action = kill ] && [ $rc = 0 ] && why="$why; the killed save exited 0"
      [ $action = fail ] && [ $rc != 0 ] && [ -n "$left" ] && why="$why; the failed save left: $left"
      if [ $action = kill ]; then # the next save clears up after the crash
        out2=$(run 1 --seed 6 --save-dir "$tmp/ck"); rc2=$?
        [ $rc2 = 0 ] && [ "$(ls "$tmp/ck" | tr '\n' ' ')" = "global_step2 latest save.lock " ] &&
          "$ZS" verify "$tmp/ck" > /dev/null || why="$why; the save after the crash: rc $rc2, left $(ls "$tmp/ck" | tr '\n' ' ') $out2"
      fi
      if [ -n "$why" ]; then
        bad=$((bad + 1))
        echo "crash: $mode, $action before step $k ($step): latest '$latest'$why" >&2
      fi
    done
  done
  [ $bad = 0 ] && r=ok || r=bad
  echo "crash: re-saving a tag ($mode), killed or failing at each of steps $first-$total: $bad bad $r"
  check $r "crash: $mode: $bad cases left no loadable latest"
done
export ZS_TEST_CKPT_NO_EXCHANGE=

# ---------------------------------------------------------------- links: links are never followed
rm -rf "$tmp/ck" "$tmp/victim"
mkdir -p "$tmp/ck" "$tmp/victim"
echo canary > "$tmp/victim/canary"
ln -s "$tmp/victim" "$tmp/ck/global_step2.tmp"
ln -s "$tmp/victim" "$tmp/ck/global_step2.old"
out=$(run 1 --seed 6 --save-dir "$tmp/ck"); rc=$?
[ $rc = 0 ] && [ "$(cat "$tmp/victim/canary" 2> /dev/null)" = canary ] && [ ! -L "$tmp/ck/global_step2.tmp" ] &&
  [ "$(loaded "$tmp/ck")" = "$new" ] && r=ok || r=bad
echo "links: <tag>.tmp and <tag>.old links to another directory: rc $rc, its files: $(ls "$tmp/victim") $r"
check $r "links: rc $rc, $(ls -l "$tmp/ck"), victim: $(ls "$tmp/victim"): $out"

# ---------------------------------------------------------------- two jobs, one directory
fresh
k=$(grep -n ' fsync .*/global_step2.tmp$' "$tmp/trace.exchange" | cut -d: -f1)
ZS_TEST_CKPT_FAULT=0:stop:$k run 1 --seed 6 --save-dir "$tmp/ck" > "$tmp/job1" &
job=$!
# the stopped processes under this shell's child $1 (the paused rank)
stopped() {
  ps -e -o pid=,ppid=,stat= | awk -v top="$1" '{ up[$1] = $2; st[$1] = $3 }
    END { for (p in up) if (st[p] ~ /^T/) { q = p; while ((q in up) && q != top && q > 1) q = up[q]; if (q == top) print p } }'
}
pid=""
for _ in $(seq 300); do # job 1 pauses holding the lock, its files written and not yet published
  pid=$(stopped $job | head -1)
  [ -n "$pid" ] && break
  sleep 0.1
done
out=$(run 1 --seed 7 --save-dir "$tmp/ck"); rc=$?
msg=$(echo "$out" | grep -m1 'error:')
files=$(ls "$tmp/ck/global_step2.tmp" 2> /dev/null | tr '\n' ' ')
[ -n "$pid" ] && [ $rc != 0 ] && echo "$msg" | grep -q "locked by another job saving into it (host $(uname -n) pid $pid" &&
  [ "$files" = "manifest.json rank00000.bin " ] && r=ok || r=bad
echo "two jobs: a second job: rc $rc: $msg $r"
check $r "two jobs: job 1 pid '$pid', its files '$files', job 2 rc $rc: $out"
for p in $(stopped $job); do kill -CONT "$p"; done
wait $job; rc=$?
[ $rc = 0 ] && "$ZS" verify "$tmp/ck" > /dev/null && [ "$(loaded "$tmp/ck")" = "$new" ] && r=ok || r=bad
echo "two jobs: the first job, resumed: rc $rc, its checkpoint loads $r"
check $r "two jobs: job 1 after the second: rc $rc, $(cat "$tmp/job1")"

# ---------------------------------------------------------------- full disk: a failed save clears up
fresh
out=$(ZS_TEST_CKPT_FAULT=1:enospc:1 run 2 --seed 6 --save-dir "$tmp/ck"); rc=$?
msg=$(echo "$out" | grep -m1 'error:')
[ $rc != 0 ] && echo "$msg" | grep -q "rank00001.bin: write at offset 0 failed: No space left on device" &&
  [ "$(ls "$tmp/ck" | tr '\n' ' ')" = "global_step2 latest save.lock " ] && [ "$(loaded "$tmp/ck")" = "$old" ] &&
  r=ok || r=bad
echo "full disk: under rank 1: rc $rc: $msg; left: $(ls "$tmp/ck" | tr '\n' ' ') $r"
check $r "full disk: $out"

finish ckpt_publish

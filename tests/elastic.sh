#!/usr/bin/env bash
# elastic.sh MODE LIBDIR [MLP] - zeroshard-run's restart policy on 4 ranks as 2 forced nodes of 2
# (ZS_FAKE_NODE_SIZE), with tests/ds_scripts/elastic_loop.py: a deepspeed.initialize loop that resumes from
# its newest checkpoint with engine.load_checkpoint and takes its data by global sample index.
#   rank     kill -9 of rank 2 at a step drawn at random: the run finishes on 3 ranks
#   node     kill -9 of both ranks of node 1: the run finishes on 2 ranks
#   save     rank 2 dies halfway through writing the checkpoint of step 6: the run resumes from step 3's
#   batch    train_batch_size 8 with a micro-batch of 1: 3 ranks remain, the batch rule admits 2, it runs on 2
# Each: the final parameters hash as an uninterrupted run restarted at the same step on the same world size
# (4 ranks to that step, then the new world from its checkpoint); steps lost at most the checkpoint interval;
# the restart's line on the launcher's output and its entry in zeroshard-restarts.json beside the checkpoints.
#   trainer  the HF Trainer (tests/ds_scripts/clm_trainer.py, run_clm.py's resume from the newest checkpoint-N
#            of its output folder), rank 2 dying in the save of checkpoint-6: the half-written folder is set
#            aside, the run resumes from checkpoint-3 on 3 ranks, and its model is an uninterrupted 4-rank run's
#            checkpoint-3 resumed on 3 ranks
#   preempt  SIGTERM to the launcher of a Trainer run (2 ranks): it saves checkpoint-N, exits 0, is not
#            restarted; the same command again resumes from checkpoint-N to the uninterrupted run's model
#   limits   --min-ranks and --max-restarts end the job non-zero naming the flag; a rank that raises keeps
#            its slot (restarted on as many ranks); the launcher's rules
#            (batch sizes, mpirun's lines, hosts dropped) on their own
#   sigterm  SIGTERM to the launcher of zs-train-mlp (MLP) is a preemption: the ranks save, exit 0, no restart
set -u
MODE=$1 LIBDIR=$2 MLP=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
S=$here/ds_scripts
. "$here/lib.sh"
modules=torch
case $MODE in trainer|preempt) modules="torch, transformers, accelerate" ;; esac
py_test_env elastic "$modules" "$LIBDIR"
# A dead rank's peers on its node notice from its pid within a second; 120 s bounds any other wait
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore ZS_FAKE_NODE_SIZE=2 ZS_TIMEOUT=120
STEPS=12 EVERY=3
zsrun() { timeout -s KILL 600 python3 -m zeroshard.run "$@"; }   # a hang fails in bounded time
loop() { # NAME NP CONFIG [launcher flags...] [-- script flags...]: runs in the background; its pid in $lpid
  local name=$1 np=$2 cfg=$3 own=()
  shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do own+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  mkdir -p "$tmp/$name"
  zsrun -np "$np" --run-dir "$tmp/$name/run" "${own[@]}" "$S/elastic_loop.py" --deepspeed_config "$S/$cfg" \
    --ckpt "$tmp/$name/ck" --steps $STEPS --save-every $EVERY --step-time 0.3 "$@" > "$tmp/$name.out" 2>&1 &
  lpid=$!
}
wait_for() { # FILE: waits for it (300 s: four ranks importing torch on a loaded 2-core machine)
  local i
  for i in $(seq 3000); do [ -s "$1" ] && return 0; sleep 0.1; done
  echo "elastic: $1 never appeared" >&2
  return 1
}
wait_step() { # NAME K: until rank 0 of the first attempt has finished step K
  local p=$tmp/$1/run/attempt0/progress s i
  for i in $(seq 3000); do
    s=$(tr -d ' \n' 2> /dev/null < "$p")
    [ "${s:-0}" -ge "$2" ] && return 0
    sleep 0.1
  done
  echo "elastic: $1 never reached step $2" >&2
  return 1
}
pid_of() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["pid"])' "$tmp/$1/run/attempt0/rank$2.json"; }
hash_of() { sed -n 's/^params-sha256 \([0-9a-f]*\) world \([0-9]*\)$/\1 \2/p' "$1" | tail -1; }
field() { # NAME PYTHON-EXPRESSION over the restart log j: prints it
  python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' \
    "$tmp/$1/ck/zeroshard-restarts.json" "$2" 2> /dev/null
}
reference() { # NAME CONFIG STEP WORLD: 4 ranks to STEP (saving), then WORLD ranks from its checkpoint to the end
  local d=$tmp/$1-ref
  mkdir -p "$d"
  [ "$3" -eq 0 ] || zsrun -np 4 "$S/elastic_loop.py" --deepspeed_config "$S/$2" --ckpt "$d/ck" --steps "$3" \
    --save-every $EVERY > "$d/a.out" 2>&1 || run_failed "$1 reference to step $3: $(why_failed "$d/a.out")"
  zsrun -np "$4" "$S/elastic_loop.py" --deepspeed_config "$S/$2" --ckpt "$d/ck" --steps $STEPS --save-every $EVERY \
    > "$d/b.out" 2>&1 || run_failed "$1 reference from step $3 on $4 ranks: $(why_failed "$d/b.out")"
  hash_of "$d/b.out"
}
# finished NAME CONFIG WORLD CAUSE-PATTERN: the checks every kill shares
finished() {
  local name=$1 cfg=$2 world=$3 pat=$4 rc line got ref resumed lost secs
  wait "$lpid"
  rc=$?
  [ $rc -eq 0 ] && check ok || { run_failed "$name: the launcher exited $rc"; tail -20 "$tmp/$name.out"; }
  line=$(grep -m1 '^zeroshard-run: restart 1/' "$tmp/$name.out")
  echo "$name: $line"
  [[ "$line" == *"$pat"* && "$line" == *"4 -> $world ranks"* ]] && check ok ||
    check fail "$name: the restart line names '$pat' and 4 -> $world ranks: '$line'"
  got=$(hash_of "$tmp/$name.out")
  resumed=$(field "$name" '(j["restarts"][0]["resumed_from"] or {"step": 0})["step"]')   # none: from the start
  lost=$(field "$name" 'j["restarts"][0]["steps_lost"]')
  secs=$(field "$name" 'j["restarts"][0]["seconds_to_first_step"]')
  [ "$(field "$name" 'len(j["restarts"]), j["finished"], j["world_final"]')" = "(1, True, $world)" ] && check ok ||
    check fail "$name: zeroshard-restarts.json: $(cat "$tmp/$name/ck/zeroshard-restarts.json" 2>&1 | tr -d '\n' | head -c 600)"
  [ -n "$lost" ] && [ "$lost" -le $EVERY ] 2> /dev/null && check ok || check fail "$name: steps lost '$lost' > $EVERY"
  [ -n "$resumed" ] || { check fail "$name: no resume recorded"; return; }
  ref=$(reference "$name" "$cfg" "$resumed" "$world")
  echo "$name: resumed from step $resumed on $world ranks, $lost step(s) lost, trained again ${secs}s after the" \
    "failure; params $got; uninterrupted run restarted at step $resumed on $world ranks: $ref"
  [ -n "$ref" ] && [ "$got" = "$ref" ] && check ok || check fail "$name: params '$got' != reference '$ref'"
}

case $MODE in
  rank)
    k=$((EVERY + 1 + RANDOM % (STEPS - EVERY - 3)))   # past the first checkpoint, short of the end
    echo "rank: kill -9 of rank 2 once step $k is done"
    loop rank 4 ds_elastic.json --max-restarts 2
    wait_for "$tmp/rank/run/attempt0/rank2.json" && wait_step rank $k && kill -9 "$(pid_of rank 2)"
    finished rank ds_elastic.json 3 "rank 2 (node 1, pid" ;;
  node)
    k=$((EVERY + 1 + RANDOM % (STEPS - EVERY - 3)))   # past the first checkpoint, short of the end
    echo "node: kill -9 of ranks 2 and 3 (node 1) once step $k is done"
    loop node 4 ds_elastic.json --max-restarts 2 --min-ranks 2
    wait_for "$tmp/node/run/attempt0/rank3.json" && wait_step node $k && kill -9 "$(pid_of node 2)" "$(pid_of node 3)"
    finished node ds_elastic.json 2 "every rank of node 1" ;;
  save)
    loop save 4 ds_elastic.json --max-restarts 1 -- --crash-save 2:6
    finished save ds_elastic.json 3 "rank 2 (node 1, pid"
    [ "$(field save '(j["restarts"][0]["resumed_from"] or {"step": 0})["step"]')" = 3 ] && check ok ||
      check fail "save: a kill during the save of step 6 resumes from step 3's checkpoint" ;;
  batch)
    k=$((EVERY + 1 + RANDOM % (STEPS - EVERY - 3)))   # past the first checkpoint, short of the end
    loop batch 4 ds_elastic8.json --max-restarts 1
    wait_for "$tmp/batch/run/attempt0/rank3.json" && wait_step batch $k && kill -9 "$(pid_of batch 3)"
    finished batch ds_elastic8.json 2 "the batch rule admits 2, not 3" ;;
  trainer)
    TR="--deepspeed $S/ds_z2.json --max_steps $STEPS --per_device_train_batch_size 1 --learning_rate 1e-3
        --logging_steps 1 --report_to none --save_steps $EVERY"
    mkdir -p "$tmp/hf"
    zsrun -np 4 --max-restarts 1 --run-dir "$tmp/hf/run" "$S/clm_trainer.py" $TR --output_dir "$tmp/hf/out" \
      --crash_save 2:6 > "$tmp/hf.out" 2>&1 || run_failed "trainer: the launcher exited $?: $(grep -m1 '^zeroshard-run: the job' "$tmp/hf.out")"
    line=$(grep -m1 '^zeroshard-run: restart 1/' "$tmp/hf.out")
    echo "trainer: $line"
    [[ "$line" == *"rank 2 (node 1, pid"*"4 -> 3 ranks"*"set aside: checkpoint-6"* ]] && [ -d "$tmp/hf/out/checkpoint-6" ] &&
      [ -d "$tmp/hf/out/checkpoint-6.incomplete" ] && check ok || check fail "trainer: restart line '$line'"
    log=$tmp/hf/out/zeroshard-restarts.json   # beside the checkpoint-N folders
    c=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["restarts"][0]; print(r["resumed_from"]["step"],
r["steps_lost"])' "$log" 2> /dev/null)
    echo "trainer: resumed from step ${c% *}, ${c#* } step(s) lost"
    [ "${c% *}" = 3 ] && [ "${c#* }" -le $EVERY ] && check ok || check fail "trainer: $log: '$c'"
    # the reference: 4 ranks straight through (saving), its checkpoint of that step resumed on 3 ranks
    zsrun -np 4 "$S/clm_trainer.py" $TR --output_dir "$tmp/hf4" > "$tmp/hf4.out" 2>&1 || run_failed "trainer 4 ranks"
    mkdir -p "$tmp/hf3" && cp -r "$tmp/hf4/checkpoint-${c% *}" "$tmp/hf3/"
    zsrun -np 3 "$S/clm_trainer.py" $TR --output_dir "$tmp/hf3" > "$tmp/hf3.out" 2>&1 || run_failed "trainer 3 ranks"
    got=$(sha256sum < "$tmp/hf/out/model.safetensors" | head -c 16)
    ref=$(sha256sum < "$tmp/hf3/model.safetensors" | head -c 16)
    echo "trainer: model.safetensors $got; 4 ranks' checkpoint-${c% *} resumed on 3 ranks: $ref"
    [ -s "$tmp/hf3/model.safetensors" ] && [ "$got" = "$ref" ] && check ok || check fail "trainer: $got != $ref" ;;
  preempt)
    TR="--deepspeed $S/ds_z2.json --max_steps $STEPS --per_device_train_batch_size 2 --learning_rate 1e-3
        --logging_steps 1 --report_to none --save_steps 100 --output_dir $tmp/pre/out"
    mkdir -p "$tmp/pre"
    # not through zsrun (a function: $! would be its subshell); timeout passes the SIGTERM on to the launcher
    timeout -s KILL 600 python3 -m zeroshard.run -np 2 --max-restarts 2 --run-dir "$tmp/pre/run" "$S/clm_trainer.py" $TR \
      --step_time 0.3 > "$tmp/pre.out" 2>&1 &
    lpid=$!
    wait_step pre 3 && kill -TERM $lpid
    wait $lpid
    rc=$?
    k=$(ls -d "$tmp"/pre/out/checkpoint-* 2> /dev/null | sed -n 's/.*checkpoint-\([0-9]*\)$/\1/p' | head -1)
    echo "preempt: exit $rc, $(grep -o -m1 'zeroshard: preempted.*' "$tmp/pre.out"); $(grep -m1 '^zeroshard-run: SIGTERM' "$tmp/pre.out")"
    [ $rc -eq 0 ] && [ -n "$k" ] && [ "$k" -lt $STEPS ] && [ -f "$tmp/pre/out/checkpoint-$k/trainer_state.json" ] &&
      [ ! -d "$tmp/pre/run/attempt1" ] && check ok ||
      check fail "SIGTERM to the launcher: exit $rc, checkpoint '$k': $(grep -v '^\[rank' "$tmp/pre.out" | tail -5)"
    zsrun -np 2 --run-dir "$tmp/pre/run2" "$S/clm_trainer.py" $TR > "$tmp/pre2.out" 2>&1 || run_failed "preempt: the resume"
    from=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["step"])' "$tmp/pre/run2/attempt0/loaded.json" 2>&1)
    TR=${TR/$tmp\/pre\/out/$tmp/straight}
    zsrun -np 2 "$S/clm_trainer.py" $TR > "$tmp/straight.out" 2>&1 || run_failed "preempt: the uninterrupted run"
    got=$(sha256sum < "$tmp/pre/out/model.safetensors" | head -c 16)
    ref=$(sha256sum < "$tmp/straight/model.safetensors" | head -c 16)
    echo "preempt: stopped at step ${k:-?} of $STEPS, the same command resumed from step $from: model $got; uninterrupted: $ref"
    [ "$from" = "$k" ] && [ -s "$tmp/straight/model.safetensors" ] && [ "$got" = "$ref" ] && check ok ||
      check fail "preempt: resumed from '$from' (saved at '$k'), model $got != $ref" ;;
  limits)
    loop minr 4 ds_elastic.json --max-restarts 2 --min-ranks 4
    wait_for "$tmp/minr/run/attempt0/rank1.json" && wait_step minr 2 && kill -9 "$(pid_of minr 1)"
    wait "$lpid"
    rc=$?
    msg=$(grep -m1 'not restarting' "$tmp/minr.out")
    echo "limits: --min-ranks 4, rank 1 killed: exit $rc: $msg"
    [ $rc -ne 0 ] && [[ "$msg" == *"under --min-ranks 4"* ]] && [ ! -d "$tmp/minr/run/attempt1" ] && check ok ||
      check fail "--min-ranks 4 with 3 left: exit $rc, '$msg'"
    # a rank that raises keeps its slot: the job starts again on as many ranks, and finishes
    loop fail 2 ds_elastic.json --max-restarts 1 -- --fail-at 1:4
    wait "$lpid" || run_failed "limits: the launcher after --fail-at exited $?: $(grep -m1 '^zeroshard-run: the job' "$tmp/fail.out")"
    msg=$(grep -m1 '^zeroshard-run: restart 1/1' "$tmp/fail.out")
    echo "limits: rank 1 raised after step 4: $msg"
    [[ "$msg" == *"rank 1 (node 0, pid"*"exited with code 1 (uncaught RuntimeError)"*"2 -> 2 ranks"* ]] && check ok ||
      check fail "a rank that raised: '$msg'"
    loop maxr 2 ds_elastic.json
    wait_for "$tmp/maxr/run/attempt0/rank1.json" && wait_step maxr 2 && kill -9 "$(pid_of maxr 1)"
    wait "$lpid"
    rc=$?
    msg=$(grep -m1 '^zeroshard-run: the job failed' "$tmp/maxr.out")
    echo "limits: no --max-restarts, rank 1 killed: exit $rc: $msg"
    [ $rc -ne 0 ] && [[ "$msg" == *"rank 1 (node 0, pid"*"killed by signal 9 (SIGKILL)"* ]] && check ok ||
      check fail "no restarts: exit $rc, '$msg'"
    # the rules on their own: batch sizes, mpirun's lines, hosts dropped from -H and a hostfile
    out=$(cd "$tmp" && python3 - << 'EOF' 2>&1
from zeroshard import _elastic as E
import io
r = {"given": {"train_batch_size": 12, "train_micro_batch_size_per_gpu": 1}}
assert E.fitting_worlds(r, 4) == [1, 2, 3, 4], E.fitting_worlds(r, 4)
r = {"given": {"train_batch_size": 16, "gradient_accumulation_steps": 2}}
assert E.fitting_worlds(r, 7) == [1, 2, 4], E.fitting_worlds(r, 7)
assert E.fitting_worlds({"given": {"train_micro_batch_size_per_gpu": 2}}, 3) == [1, 2, 3]
w = E.MpirunWatch(io.StringIO(
    "mpirun noticed that process rank 5 with PID 0 on node n2 exited on signal 9 (Killed).\n"), io.StringIO())
w.join()
assert (w.rank, w.host, w.signal, w.code) == (5, "n2", 9, None), vars(w)
w = E.MpirunWatch(io.StringIO("  Process name: [[4711,1],3]\n  Exit code:    7\n"), io.StringIO())
w.join()
assert (w.rank, w.code) == (3, 7), vars(w)
w = E.MpirunWatch(io.StringIO("  HNP daemon   : [[1,0],0] on node a\n  Remote daemon: [[1,0],1] on node b\n"),
                  io.StringIO())
w.join()
assert w.lost_hosts == ["b"], w.lost_hosts
assert E.drop_hosts(["-H", "a:2,b:2,c:2"], ["b"], ".") == (["-H", "a:2,c:2"], ["b"])
open("hosts", "w").write("a slots=2\nb slots=2 # the second\n")
opts, gone = E.drop_hosts(["--hostfile", "hosts", "--bind-to", "core"], ["a"], ".")
assert gone == ["a"] and open(opts[1]).read() == "b slots=2\n" and opts[2:] == ["--bind-to", "core"], opts
print("rules ok")
EOF
)
    echo "limits: $out"
    [ "$out" = "rules ok" ] && check ok || check fail "the launcher's rules: $out" ;;
  sigterm)
    printf '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": 2}}\n' > "$tmp/z2.json"
    mkdir -p "$tmp/pre"
    # not through zsrun (a function: $! would be its subshell); timeout passes the SIGTERM on to the launcher
    timeout -s KILL 600 python3 -m zeroshard.run -np 2 --max-restarts 3 --run-dir "$tmp/pre/run" "$MLP" --config "$tmp/z2.json" --hidden 32 --steps 100000 \
      --save-dir "$tmp/pre/ck" --save-every 20 > "$tmp/pre.out" 2>&1 &
    lpid=$!
    wait_for "$tmp/pre/ck/latest" && kill -TERM $lpid
    wait $lpid
    rc=$?
    k=$(sed -n 's/^preempted: stopped after step \([0-9]*\).*/\1/p' "$tmp/pre.out")
    echo "sigterm: exit $rc, stopped after step ${k:-?}: $(grep -m1 '^zeroshard-run: SIGTERM' "$tmp/pre.out")"
    [ $rc -eq 0 ] && [ -n "$k" ] && [ -d "$tmp/pre/ck/global_step$k" ] && check ok ||
      check fail "SIGTERM to the launcher: exit $rc, step '$k': $(tail -5 "$tmp/pre.out")"
    # a program records no saves for the launcher: its log stays in the run folder
    [ ! -d "$tmp/pre/run/attempt1" ] && grep -q '"preempted": "SIGTERM"' "$tmp/pre/run/zeroshard-restarts.json" &&
      check ok || check fail "SIGTERM: restarted, or not recorded as a preemption" ;;
  *) echo "elastic.sh: unknown mode $MODE" >&2; exit 2 ;;
esac
finish "elastic $MODE"

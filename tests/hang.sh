#!/usr/bin/env bash
# hang.sh CASE MLP GPT TEST_HANG ZS_FLIGHT DATA - faults that used to leave ranks waiting forever,
# each ending in one message that names what and who, with no process left behind:
#   stop     a rank stopped (SIGSTOP) mid-step (stage 2, and stage 3 where the others wait in the shared
#            heap's vote): the others fail within ZS_TIMEOUT naming it
#   die      a rank killed (SIGKILL) mid-step: the others name it within about a second, unless mpirun
#            ends the job first (Open MPI aborts a job whose process died); either way nothing is left
#   sigusr1  SIGUSR1 makes waiting ranks write their flight recorder
#   flight   zs-flight names the divergence (two ranks, different operations at one sequence number) and
#            the rank that is behind, from the recorders the failures wrote
#   config   bad timeout_s / ZS_TIMEOUT rejected by name; the config's flight_dir receives the dumps
#   preempt  SIGTERM: the examples finish the step, save, exit 0; --load continues bit-exactly (by a test
#            hook that raises SIGTERM at a chosen step, and by a real kill -TERM of every rank)
set -u
CASE=$1 MLP=$2 GPT=$3 TEST_HANG=$4 ZS_FLIGHT=$5 DATA=$6
. "$(dirname "$0")/lib.sh"
export OMPI_MCA_rmaps_base_oversubscribe=1

cat > "$tmp/z2.json" <<JSON
{"train_batch_size": 24, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 2}}
JSON
sed 's/"stage": 2}/"stage": 3, "stage3_param_persistence_threshold": 0}/' "$tmp/z2.json" > "$tmp/z3.json"
cat > "$tmp/g3.json" <<JSON
{"train_batch_size": 4, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
JSON

# No process of this test's runs may outlive it: their command lines name $tmp.
no_leftovers() {
  local left
  sleep 1
  left=$(pgrep -f -- "$tmp/" | grep -v "^$$\$" || true)
  if [ -n "$left" ]; then
    check fail "$1: processes left behind: $(for p in $left; do tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null; echo; done)"
    kill -9 $left 2>/dev/null
  else
    check ok
  fi
}

# mlp NP [-x VAR=VALUE]... [program flags]: mpirun's own options must come before the program.
mlp() { local np=$1 x=(); shift; while [ "${1:-}" = -x ]; do x+=(-x "$2"); shift 2; done
  timeout -k 5 60 mpirun -np "$np" "${x[@]}" "$MLP" --config "$tmp/z2.json" --hidden 32 --quiet "$@"; }

case_stop() {
  local out rc
  # stage 3, stopped before operation 5: the others wait in the shared heap's vote for the next fetch
  out=$(timeout -k 5 60 mpirun -np 3 -x ZS_TIMEOUT=3 -x ZS_TEST_COMM_FAULT=stop:5:1 "$MLP" --config "$tmp/z3.json" \
        --hidden 32 --quiet --steps 10 2>&1)
  rc=$?
  echo "$out" | grep -m1 'zeroshard: error'
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q "rank [02]: timeout: .*ranks not arrived: 1$" && check ok ||
    check fail "stop (stage 3): rc $rc, no timeout naming rank 1: $out"
  out=$(mlp 3 -x ZS_TIMEOUT=3 -x ZS_FLIGHT_DIR="$tmp/fl" -x ZS_TEST_COMM_FAULT=stop:20:1 --steps 10 2>&1)
  rc=$?
  echo "$out" | grep 'zeroshard: error' | head -2
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || check fail "stop: mpirun returned $rc (0: the stop went unnoticed; 124: ended by the backstop)"
  if echo "$out" | grep -Eq 'rank [02]: timeout: operation 2[0-9]? .*did not complete in 3\.[0-9] s.*ranks not arrived: 1$'; then
    check ok
  else
    check fail "stop: no timeout message naming rank 1: $out"
  fi
  "$ZS_FLIGHT" "$tmp/fl" > "$tmp/verdict" 2>&1
  cat "$tmp/verdict"
  grep -q 'rank 1 wrote no record' "$tmp/verdict" && check ok || check fail "stop: zs-flight did not name rank 1"
  no_leftovers stop
}

case_die() {
  local out
  out=$(mlp 3 -x ZS_TIMEOUT=20 -x ZS_TEST_COMM_FAULT=die:20:1 --steps 10 2>&1)
  [ $? -eq 124 ] && check fail "die: the backstop had to end the job"
  if echo "$out" | grep -q 'a peer on this node has exited: rank 1 (pid'; then
    echo "die: the library noticed: $(echo "$out" | grep -m1 'has exited')"
    check ok
  elif echo "$out" | grep -q 'process rank 1 .*exited on signal 9'; then
    echo "die: mpirun ended the job before the library noticed: $(echo "$out" | grep -m1 'exited on signal')"
    check ok
  else
    check fail "die: neither the library nor mpirun named rank 1: $out"
  fi
  no_leftovers die
}

# Open MPI told not to end the job when a process dies (--enable-recovery): the survivors must name the
# dead rank themselves, from its pid, within a second or two, long before the 20 s timeout.
case_die_recovery() {
  local out
  out=$(timeout -k 5 60 mpirun --enable-recovery -np 3 -x ZS_TIMEOUT=20 -x ZS_TEST_COMM_FAULT=die:20:1 "$MLP" \
        --config "$tmp/z2.json" --hidden 32 --quiet --steps 10 2>&1)
  [ $? -eq 124 ] && check fail "die-recovery: the backstop had to end the job"
  echo "$out" | grep 'zeroshard: error' | head -2
  [ "$(echo "$out" | grep -c 'rank [02]: operation 2[0-9]* (.*cannot complete: after [0-9.]* s a peer on this node has exited: rank 1 (pid')" -ge 1 ] &&
    check ok || check fail "die-recovery: no rank named the dead rank 1: $out"
  no_leftovers die-recovery
}

# The keys and the variable: bad values rejected by name; the config's flight_dir is where dumps go.
case_config() {
  local out
  printf '{"train_micro_batch_size_per_gpu": 2, "zeroshard": {"timeout_s": 0}}\n' > "$tmp/bad.json"
  out=$(mpirun -np 1 "$MLP" --config "$tmp/bad.json" --steps 1 2>&1)
  echo "$out" | grep -m1 'error'
  echo "$out" | grep -q 'zeroshard.timeout_s' && check ok || check fail "config: timeout_s 0 not rejected by name: $out"
  out=$(mpirun -np 1 -x ZS_TIMEOUT=soon "$MLP" --config "$tmp/z2.json" --steps 1 2>&1)
  echo "$out" | grep -m1 'error'
  echo "$out" | grep -q "ZS_TIMEOUT: expected seconds > 0, got 'soon'" && check ok ||
    check fail "config: ZS_TIMEOUT=soon not rejected by name: $out"
  sed 's|"zero_optimization"|"zeroshard": {"timeout_s": 30, "flight_dir": "'"$tmp"'/cfgdir"}, "zero_optimization"|' \
    "$tmp/z2.json" > "$tmp/fd.json"
  timeout -k 5 60 mpirun -np 3 -x ZS_TEST_COMM_FAULT=die:20:1 "$MLP" --config "$tmp/fd.json" --hidden 32 --quiet \
    --steps 10 > "$tmp/fd.log" 2>&1
  ls "$tmp/cfgdir" 2>/dev/null | tr '\n' ' '; echo
  grep -q 'why: .*rank 1' "$tmp/cfgdir/flight-rank0.txt" "$tmp/cfgdir/flight-rank2.txt" 2>/dev/null && check ok ||
    echo "config: the survivors wrote no record in the config's flight_dir (mpirun may have ended them first)"
  no_leftovers config
}

# The process ids of a run's ranks (children of mpirun that run the program).
rank_pids() { pgrep -f -- "^$1 --config $tmp/"; }

case_sigusr1() {
  local pids stopped=""
  mlp 3 -x ZS_TIMEOUT=30 -x ZS_FLIGHT_DIR="$tmp/u1" -x ZS_TEST_COMM_FAULT=stop:20:1 --steps 10 > "$tmp/u1.log" 2>&1 &
  for _ in $(seq 100); do
    for p in $(rank_pids "$MLP"); do
      [ "$(awk '{print $3}' /proc/$p/stat 2>/dev/null)" = T ] && stopped=$p
    done
    [ -n "$stopped" ] && break
    sleep 0.1
  done
  [ -n "$stopped" ] || check fail "sigusr1: rank 1 never stopped"
  pids=$(rank_pids "$MLP")
  kill -USR1 $pids
  for _ in $(seq 100); do
    [ "$(grep -l '^# why: SIGUSR1' "$tmp"/u1/flight-rank*.txt 2>/dev/null | wc -l)" -ge 2 ] && break
    sleep 0.1
  done
  ls "$tmp/u1" 2>/dev/null
  [ "$(grep -l '^# why: SIGUSR1' "$tmp"/u1/flight-rank*.txt 2>/dev/null | wc -l)" -ge 2 ] && check ok ||
    check fail "sigusr1: the two waiting ranks did not write their recorders"
  kill -9 $pids 2>/dev/null
  wait
  no_leftovers sigusr1
}

case_flight() {
  timeout -s KILL 60 mpirun -np 2 -x ZS_FLIGHT_DIR="$tmp/div" "$TEST_HANG" order > "$tmp/div.log" 2>&1 ||
    check fail "flight: test_hang order failed: $(cat "$tmp/div.log")"
  "$ZS_FLIGHT" "$tmp/div" > "$tmp/v1"
  cat "$tmp/v1"
  # operation numbers count set-up's collectives too, so the test reads them rather than fixing them
  grep -Eq '^divergence at operation ([0-9]+): rank 0 issued operation \1: all-gather \(fetch of unit 0\).*rank 1 issued operation \1: all-gather \(fetch of unit 1\)' "$tmp/v1" &&
    check ok || check fail "flight: zs-flight did not name the divergence"
  timeout -s KILL 60 mpirun -np 2 -x ZS_TIMEOUT=2 -x ZS_FLIGHT_DIR="$tmp/beh" "$TEST_HANG" behind > "$tmp/beh.log" 2>&1 ||
    check fail "flight: test_hang behind failed: $(cat "$tmp/beh.log")"
  "$ZS_FLIGHT" "$tmp/beh" > "$tmp/v2"
  cat "$tmp/v2"
  local last next
  last=$(sed -nE 's/^rank 1 is behind: its last operation ([0-9]+): .*rank 0 went on to operation ([0-9]+).*/\1/p' "$tmp/v2")
  next=$(sed -nE 's/^rank 1 is behind: its last operation ([0-9]+): .*rank 0 went on to operation ([0-9]+).*/\2/p' "$tmp/v2")
  [ -n "$last" ] && [ "$next" = $((last + 1)) ] && check ok ||
    check fail "flight: zs-flight did not name rank 1 as behind"
}

hash_of() { awk '/^params-hash/ {print $2}' "$1"; }

# preempt_run NAME RUNNER... : an uninterrupted run, a run preempted at step 4 by the hook, its resume.
preempt_hook() {
  local name=$1 ref got
  shift
  "$@" > "$tmp/$name-ref.log" 2>&1 || run_failed "$name uninterrupted: $(tail -3 "$tmp/$name-ref.log")"
  ref=$(hash_of "$tmp/$name-ref.log")
  "$@" -x ZS_TEST_SIGTERM=4:1 --save-dir "$tmp/$name-ck" > "$tmp/$name-a.log" 2>&1
  [ $? -eq 0 ] && grep -q '^preempted: stopped after step 4' "$tmp/$name-a.log" && [ -z "$(hash_of "$tmp/$name-a.log")" ] &&
    check ok || check fail "$name: SIGTERM at step 4 did not stop the run cleanly: $(tail -3 "$tmp/$name-a.log")"
  [ -f "$tmp/$name-ck/latest" ] && check ok || check fail "$name: no checkpoint saved"
  "$@" --save-dir "$tmp/$name-ck" --load "$tmp/$name-ck" > "$tmp/$name-b.log" 2>&1 ||
    run_failed "$name resume: $(tail -3 "$tmp/$name-b.log")"
  got=$(hash_of "$tmp/$name-b.log")
  echo "$name: uninterrupted $ref, preempted at step 4 and resumed $got"
  [ -n "$ref" ] && [ "$ref" = "$got" ] && check ok || check fail "$name: resumed params-hash $got != $ref"
}

mlp_run() { mlp 2 "$@" --steps 10; }
gpt_run() { local x=(); while [ "${1:-}" = -x ]; do x+=(-x "$2"); shift 2; done
  timeout -s KILL 120 mpirun -np 2 "${x[@]}" "$GPT" --config "$tmp/g3.json" --data "$DATA" --steps 8 --layers 1 \
    --dim 16 --heads 2 --ctx 8 --val-every 0 --seed 5 --quiet "$@"; }

# A real SIGTERM to every rank at a moment nobody chose: the run stops after some step k, saves, exits 0,
# and the resume to the same final step gives the uninterrupted run's bits.
preempt_kill() {
  local ref got pids k
  timeout -s KILL 120 mpirun -np 2 "$MLP" --config "$tmp/z2.json" --hidden 32 --quiet --steps 3000 > "$tmp/k-ref.log" 2>&1 ||
    run_failed "kill reference: $(tail -3 "$tmp/k-ref.log")"
  ref=$(hash_of "$tmp/k-ref.log")
  timeout -s KILL 120 mpirun -np 2 "$MLP" --config "$tmp/z2.json" --hidden 32 --quiet --steps 3000 --save-dir "$tmp/k-ck" \
    > "$tmp/k-a.log" 2>&1 &
  for _ in $(seq 200); do grep -q '^step 50 ' "$tmp/k-a.log" 2>/dev/null && break; sleep 0.05; done
  pids=$(rank_pids "$MLP")
  kill -TERM $pids 2>/dev/null
  wait $!
  local rc=$?
  k=$(sed -n 's/^preempted: stopped after step \([0-9]*\).*/\1/p' "$tmp/k-a.log")
  [ $rc -eq 0 ] && [ -n "$k" ] && check ok || check fail "kill -TERM: rc $rc, $(tail -3 "$tmp/k-a.log")"
  timeout -s KILL 120 mpirun -np 2 "$MLP" --config "$tmp/z2.json" --hidden 32 --quiet --steps 3000 --save-dir "$tmp/k-ck" \
    --load "$tmp/k-ck" > "$tmp/k-b.log" 2>&1 || run_failed "kill resume: $(tail -3 "$tmp/k-b.log")"
  got=$(hash_of "$tmp/k-b.log")
  echo "kill -TERM of both ranks: stopped after step ${k:-?} of 3000; uninterrupted $ref, resumed $got"
  [ -n "$ref" ] && [ "$ref" = "$got" ] && check ok || check fail "kill -TERM: resumed params-hash $got != $ref"
}

case "$CASE" in
  stop) case_stop ;;
  die) case_die ;;
  die-recovery) case_die_recovery ;;
  config) case_config ;;
  sigusr1) case_sigusr1 ;;
  flight) case_flight ;;
  preempt) export ZS_TIMEOUT=15; preempt_hook mlp mlp_run; preempt_hook gpt gpt_run; preempt_kill ;;
  *) echo "hang.sh: unknown case $CASE"; exit 2 ;;
esac
finish "hang $CASE"

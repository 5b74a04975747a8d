#!/usr/bin/env bash
# chaos.sh MLP [SEED] - a run killed several times at seeded random moments (kill -9 of one rank, mid-step
# or mid-checkpoint), relaunched each time with the same command and --load from the save directory, ends
# with the params-hash of the run never interrupted; and no kill leaves a process behind or a hang.
set -u
MLP=$1 SEED=${2:-14}
STEPS=300 KILLS=4
. "$(dirname "$0")/lib.sh"
export OMPI_MCA_rmaps_base_oversubscribe=1
RANDOM=$SEED

cat > "$tmp/c.json" <<JSON
{"train_batch_size": 16, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 20, "total_num_steps": $STEPS}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
JSON
run() { timeout -k 5 120 mpirun -np 2 -x ZS_TIMEOUT=10 "$MLP" --config "$tmp/c.json" --hidden 48 --quiet --seed 7 \
        --steps $STEPS "$@"; }
hash_of() { awk '/^params-hash/ {print $2}' "$1"; }
last_step() { sed -n 's/^step \([0-9]*\) .*/\1/p' "$1" | tail -n 1; }

run > "$tmp/ref.log" 2>&1 || run_failed "uninterrupted run: $(tail -3 "$tmp/ref.log")"
ref=$(hash_of "$tmp/ref.log")

for k in $(seq $KILLS); do
  load=()
  [ -e "$tmp/ck/latest" ] && load=(--load "$tmp/ck")
  at=$(( RANDOM % 60 + 5 )) victim=$(( RANDOM % 2 ))
  run --save-dir "$tmp/ck" --save-every 7 "${load[@]}" > "$tmp/run$k.log" 2>&1 &
  job=$!
  from=$(last_step "$tmp/run$k.log")
  # the moment: `at` steps into this launch (or the end, if it comes first), then one rank is killed
  for _ in $(seq 400); do
    s=$(last_step "$tmp/run$k.log")
    [ -n "$s" ] && [ "$s" -ge $(( ${from:-0} + at )) ] && break
    kill -0 $job 2>/dev/null || break
    sleep 0.02
  done
  pid=$(pgrep -f -- "^$MLP --config $tmp/" | sed -n "$(( victim + 1 ))p")
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  wait $job
  rc=$?
  [ $rc -eq 124 ] && check fail "kill $k: the job did not end after rank $victim was killed (backstop)"
  echo "kill $k: rank $victim killed near step $(last_step "$tmp/run$k.log") (latest: $(cat "$tmp/ck/latest" 2>/dev/null)), mpirun rc $rc"
  left=$(pgrep -f -- "$tmp/" || true)
  [ -z "$left" ] && check ok || { check fail "kill $k: processes left: $left"; kill -9 $left; }
done
run --save-dir "$tmp/ck" --save-every 7 --load "$tmp/ck" > "$tmp/final.log" 2>&1 ||
  run_failed "final resume: $(tail -3 "$tmp/final.log")"
got=$(hash_of "$tmp/final.log")
echo "uninterrupted $ref; after $KILLS kills and resumes $got"
[ -n "$ref" ] && [ "$ref" = "$got" ] && check ok || check fail "the resumed run's params-hash $got != $ref"
finish chaos

#!/usr/bin/env bash
# ckpt.sh TRAIN ZS_CKPT ST_CHECK_PY - checkpoints through the example program:
#  1. bit-exact resume: N steps straight == k steps, save, new processes, load, N-k steps (every stage,
#     offload cpu and nvme);
#  2. reshard: saved by 4 ranks at stage 3, loaded by 2 ranks at stage 1 and 3 ranks at stage 2 (and
#     more): the loaded parameters hash to what the saving run printed, and training goes on;
#  3. export to safetensors, read back by the reference package (skipped without it) against --dump,
#     and imported into a new run (same parameters);
#  4. a rank killed mid-save: `latest` still names the previous checkpoint, which verifies and loads;
#  5. bad input: a truncated file, a flipped byte, another model, another optimizer.
set -u
TRAIN=$1 ZS=$2 PY=$3
. "$(dirname "$0")/lib.sh"

# cfg NAME STAGE [EXTRA_ZERO_KEYS]
cfg() {
  cat > "$tmp/$1.json" <<JSON
{
  "train_batch_size": 24, "gradient_clipping": 0.5, "steps_per_print": 0,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 12}},
  "zero_optimization": {"stage": $2, "stage3_param_persistence_threshold": 0 ${3:-}}
}
JSON
}
# train NAME RANKS STEPS [ARGS...] -> the params-hash; a failed run prints FAILED-NAME and fails the test by
# itself (run_failed: two failed runs never compare equal)
train() {
  local name=$1 n=$2 steps=$3 out
  shift 3
  out=$(mpirun --oversubscribe -np "$n" -x ZS_TEST_OVERFLOW "$TRAIN" --config "$tmp/$name.json" --steps "$steps" \
        --seed 5 --hidden 24 \
        --quiet "$@" 2>&1)
  if [ $? -ne 0 ]; then run_failed "$name at $n ranks: $out"; echo "FAILED-$name"; return; fi
  echo "$out" | awk '/^params-hash/ {print $2}'
}

nv=$tmp/nvme
mkdir -p "$nv"
cfg s0 0; cfg s1 1; cfg s2 2; cfg s3 3
cfg off2 2 ', "offload_optimizer": {"device": "cpu"}'
cfg off3 3 ', "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}'
cfg nvme3 3 ', "sub_group_size": 500, "offload_optimizer": {"device": "nvme", "nvme_path": "'"$nv"'"},
             "offload_param": {"device": "nvme", "nvme_path": "'"$nv"'"}'
cfg nvme1 1 ', "offload_optimizer": {"device": "nvme", "nvme_path": "'"$nv"'"}'

cfg bf1 1 '}, "bf16": {"enabled": true'
cfg bfnv2 2 ', "offload_optimizer": {"device": "nvme", "nvme_path": "'"$nv"'"}}, "bf16": {"enabled": true'
cfg fp3 3 '}, "fp16": {"enabled": true, "initial_scale_power": 10, "loss_scale_window": 2'

# 1. bit-exact resume at the same world size and stage (16-bit too: masters, working copies, and with
#    fp16 the dynamic loss scale, which overflows injected before the save have moved)
export ZS_TEST_OVERFLOW=
for name in s0 s1 s2 s3 off2 off3 nvme1 nvme3 bf1 bfnv2 fp3; do
  [ $name = fp3 ] && export ZS_TEST_OVERFLOW=0:2,3 || export ZS_TEST_OVERFLOW=
  straight=$(train $name 2 8)
  rm -rf "$tmp/ck_$name"
  train $name 2 5 --save-dir "$tmp/ck_$name" > /dev/null
  resumed=$(train $name 2 8 --load "$tmp/ck_$name")
  [ "$straight" = "$resumed" ] && [ -n "$straight" ] && [ "${straight#FAILED}" = "$straight" ] && r=ok || r=bad
  echo "resume $name: straight $straight resumed $resumed $r"; check $r "resume $name: $resumed != $straight"
done
export ZS_TEST_OVERFLOW=

# 2. reshard: save at 4 ranks, stage 3 (every 2 steps and at the end: step 5)
rm -rf "$tmp/ck4"
saved=$(train s3 4 5 --save-dir "$tmp/ck4" --save-every 2)
[ "$(cat "$tmp/ck4/latest")" = global_step5 ] && r=ok || r=bad; check $r "latest is $(cat "$tmp/ck4/latest")"
for load in "2 s1" "3 s2" "1 s0" "3 nvme3" "2 off3"; do
  set -- $load
  h=$(train $2 $1 5 --load "$tmp/ck4")
  [ "$h" = "$saved" ] && r=ok || r=bad
  echo "reshard 4 ranks stage 3 -> $1 ranks $2: $h (saved $saved) $r"; check $r "reshard to $1 ranks $2: $h != $saved"
done
out=$(mpirun --oversubscribe -np 3 "$TRAIN" --config "$tmp/s2.json" --steps 9 --seed 5 --hidden 24 --quiet \
      --load "$tmp/ck4" 2>&1)
last=$(echo "$out" | awk '/^step 9 loss/ {print $4}')
first=$(echo "$out" | awk '/^step 6 loss/ {print $4}')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b != "" && b + 0 == b && b < 10) }' && r=ok || r=bad
echo "reshard: 3 ranks stage 2 trained on from step 5: loss $first (step 6) -> $last (step 9) $r"
check $r "training after a reshard: $out"

# 3. export, read back independently (fp32 bit for bit; bf16 rounded to nearest even)
train s0 1 5 --load "$tmp/ck4" --dump "$tmp/ref.f32" > /dev/null
"$ZS" export "$tmp/ck4" "$tmp/model.safetensors" > /dev/null && r=ok || r=bad
check $r "zs-ckpt export failed"
h=$(train s3 2 0 --init-from "$tmp/model.safetensors")
[ "$h" = "$saved" ] && r=ok || r=bad
echo "import: 2 ranks stage 3 initialised from the export: $h (saved $saved) $r"; check $r "import: $h != $saved"
python3 "$PY" "$tmp/model.safetensors" "$tmp/ref.f32"; rc=$?
if [ $rc -ne 77 ]; then
  [ $rc = 0 ] && r=ok || r=bad; check $r "the exported fp32 tensors differ from the run's parameters"
  "$ZS" export "$tmp/ck4" "$tmp/b.safetensors" --dtype bf16 > /dev/null && python3 "$PY" --dtype bf16 "$tmp/b.safetensors" "$tmp/ref.f32"
  [ $? = 0 ] && r=ok || r=bad; check $r "the exported bf16 tensors differ"
fi

# 4. rank 1 killed while writing the step-4 checkpoint: step 2 stays the latest, whole and loadable
rm -rf "$tmp/ckc"
at2=$(train s2 2 2)
ZS_TEST_CKPT_CRASH=1:4 mpirun --oversubscribe -np 2 -x ZS_TEST_CKPT_CRASH "$TRAIN" --config "$tmp/s2.json" --steps 6 \
  --seed 5 --hidden 24 --quiet --save-dir "$tmp/ckc" --save-every 2 > /dev/null 2>&1
[ $? -ne 0 ] && [ "$(cat "$tmp/ckc/latest")" = global_step2 ] && r=ok || r=bad
echo "crash mid-save: latest $(cat "$tmp/ckc/latest"), leftovers: $(ls "$tmp/ckc" | tr '\n' ' ') $r"
check $r "after a crash in the step-4 save, latest is $(cat "$tmp/ckc/latest")"
"$ZS" verify "$tmp/ckc" > /dev/null && r=ok || r=bad; check $r "the previous checkpoint does not verify"
h=$(train s2 2 2 --load "$tmp/ckc")
[ "$h" = "$at2" ] && r=ok || r=bad; check $r "the previous checkpoint loads as $h, not $at2"
train s2 2 4 --load "$tmp/ckc" --save-dir "$tmp/ckc" > /dev/null # a later save clears the leftover
[ ! -e "$tmp/ckc/global_step4.tmp" ] && [ "$(cat "$tmp/ckc/latest")" = global_step4 ] && r=ok || r=bad
check $r "the save after the crash left $(ls "$tmp/ckc" | tr '\n' ' ')"

# 5. bad input: each load fails with a message naming the file or field
expect() { # expect NAME PATTERN RANKS CONFIG ARGS...
  local name=$1 pat=$2 n=$3 c=$4 out
  shift 4
  out=$(mpirun --oversubscribe -np "$n" "$TRAIN" --config "$tmp/$c.json" --steps 5 --seed 5 --quiet "$@" 2>&1)
  if [ $? -ne 0 ] && echo "$out" | grep -q -- "$pat"; then r=ok; else r=bad; fi
  echo "$name: $(echo "$out" | grep -m1 'error:') $r"; check $r "$name: no error matching '$pat' in: $out"
}
expect "import into another model" "tensor 'layer0.weight' has 2 dimensions" 2 s1 --hidden 16 \
  --init-from "$tmp/model.safetensors"
cp -r "$tmp/ck4" "$tmp/bad"
expect "other model" "a different model\|units\[0\] is" 2 s1 --hidden 16 --load "$tmp/bad"
sed 's/"AdamW"/"SGD"/' "$tmp/s1.json" > "$tmp/sgd.json"
expect "other optimizer" "optimizer 'AdamW', the config's is 'SGD'" 2 sgd --hidden 24 --load "$tmp/bad"
f=$tmp/bad/global_step5/rank00002.bin
truncate -s $(($(stat -c %s "$f") / 2)) "$f"
expect "truncated file" "rank00002.bin" 2 s1 --hidden 24 --load "$tmp/bad"
"$ZS" verify "$tmp/bad" > "$tmp/v.txt" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q rank00002.bin "$tmp/v.txt" && r=ok || r=bad; check $r "verify missed the truncation: $(cat "$tmp/v.txt")"
rm -rf "$tmp/bad"; cp -r "$tmp/ck4" "$tmp/bad"
f=$tmp/bad/global_step5/rank00001.bin
printf '\x5a' | dd of="$f" bs=1 seek=100 conv=notrunc 2> /dev/null
"$ZS" verify "$tmp/bad" > "$tmp/v.txt" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "rank00001.bin.*crc32c" "$tmp/v.txt" && r=ok || r=bad
echo "flipped byte: $(grep -m1 rank00001 "$tmp/v.txt") $r"; check $r "verify missed a flipped byte: $(cat "$tmp/v.txt")"
expect "flipped byte at load" "rank00001.bin: crc32c" 2 s1 --hidden 24 --load "$tmp/bad"
echo '{"format": "zeroshard-checkpoint", "version": 1, "segments": 7}' > "$tmp/bad/global_step5/manifest.json"
expect "bad manifest" "manifest.json" 2 s1 --hidden 24 --load "$tmp/bad"

finish ckpt

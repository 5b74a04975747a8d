#!/usr/bin/env bash
# oracle_gpt.sh N TRAIN DATA ZS_CKPT - the stage oracle on the transformer at N ranks: stages 0-3, with the
# optimizer state (and at stage 3 the parameters) in memory, in the pinned host pool and on NVMe, and
# stage 3 with activation recomputation, and a stage-3 run saved and resumed, all give the bit-identical
# params-hash of stage 0; in bf16 and fp16, stage 3 (with recomputation) gives stage 0's bits; a
# checkpoint exported to safetensors (Hugging Face GPT-2 names) and loaded with --init-from gives its bits.
set -u
N=$1 TRAIN=$2 DATA=$3 ZS_CKPT=$4
. "$(dirname "$0")/lib.sh"
nv=$(mktemp -d -p "${ZS_TEST_NVME_DIR:-$PWD}")
trap 'rm -rf "$tmp" "$nv"' EXIT

# cfg NAME STAGE [EXTRA_ZERO_KEYS]
cfg() {
  cat > "$tmp/$1.json" <<JSON
{
  "train_batch_size": 6, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, "steps_per_print": 0,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2, "total_num_steps": 6}},
  "zero_optimization": {"stage": $2, "reduce_bucket_size": 5000, "stage3_param_persistence_threshold": 0 ${3:-}}
}
JSON
}

run() { # run NAME [FLAGS...] -> the params-hash, or FAILED-NAME (counted as a failure by run_failed)
  local name=$1 out h
  shift
  out=$(mpirun --oversubscribe -np "$N" "$TRAIN" --config "$tmp/$name.json" --data "$DATA" --steps 6 --layers 2 \
        --dim 32 --heads 2 --ctx 16 --val-every 3 --val-batches 1 --sample 8 --seed 4 --quiet "$@" 2>&1)
  if [ $? -ne 0 ]; then run_failed "$name at $N ranks: $out"; echo "FAILED-$name"; return; fi
  h=$(echo "$out" | awk '/^params-hash/ {print $2}')
  [ -n "$h" ] || { run_failed "$name printed no params-hash: $out"; h="FAILED-$name"; }
  echo "$h"
}

cpu='"offload_optimizer": {"device": "cpu"}'
nvme='"offload_optimizer": {"device": "nvme", "nvme_path": "'"$nv"'"}'
cfg s0 0
ref=$(run s0)
echo "np $N stage 0 params-hash $ref"
for s in 1 2 3; do
  cfg "s$s" $s; cfg "s${s}_cpu" $s ", $cpu"; cfg "s${s}_nvme" $s ", \"sub_group_size\": 3000, $nvme"
done
cfg s3_pcpu 3 ", $cpu, \"offload_param\": {\"device\": \"cpu\"}"
cfg s3_pnvme 3 ", $nvme, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"$nv\"}"
for name in s1 s2 s3 s1_cpu s2_cpu s3_cpu s3_pcpu s1_nvme s2_nvme s3_nvme s3_pnvme; do
  h=$(run $name); [ "$h" = "$ref" ] && r=ok || r=bad
  echo "np $N $name: $h $r"; check $r "$name: params-hash $h != stage 0's $ref"
done
h=$(run s3 --recompute); [ "$h" = "$ref" ] && r=ok || r=bad
echo "np $N s3 --recompute: $h $r"; check $r "stage 3 with --recompute: params-hash $h != $ref"
# 16-bit parameters (widened for the math, gradients rounded into the engine's buffers): stage 3 against 0
for dt in bf16 fp16; do
  cfg ${dt}_s0 0 ""; cfg ${dt}_s3 3 ""
  sed -i "s/\"steps_per_print\": 0,/\"steps_per_print\": 0, \"$dt\": {\"enabled\": true},/" "$tmp/${dt}_s0.json" "$tmp/${dt}_s3.json"
  h0=$(run ${dt}_s0); h3=$(run ${dt}_s3 --recompute)
  [ "$h0" = "$h3" ] && [ "$h0" != "$ref" ] && r=ok || r=bad
  echo "np $N $dt stage 0 $h0, stage 3 with --recompute $h3 $r"; check $r "$dt: stage 3 $h3 != stage 0 $h0 (fp32 $ref)"
done
# save at step 3, resume to step 6: the same bits as the uninterrupted run
at3=$(run s3 --steps 3 --save-dir "$tmp/ckpt")
h=$(run s3 --load "$tmp/ckpt"); [ "$h" = "$ref" ] && r=ok || r=bad
echo "np $N s3 saved at step 3, resumed to 6: $h $r"; check $r "resumed run: params-hash $h != $ref"
# the step-3 checkpoint exported, then loaded by --init-from (no training): the step-3 bits
"$ZS_CKPT" export "$tmp/ckpt" "$tmp/gpt.safetensors" > /dev/null || run_failed "zs-ckpt export $tmp/ckpt"
names=$("$ZS_CKPT" st-dump "$tmp/gpt.safetensors" | grep -c -E '^(wte|wpe|h\.[01]\.(ln_[12]|attn\.c_(attn|proj)|mlp\.c_(fc|proj))|ln_f)\.(weight|bias) F32')
h=$(run s2 --steps 0 --init-from "$tmp/gpt.safetensors"); [ "$h" = "$at3" ] && [ "$names" = 28 ] && r=ok || r=bad
echo "np $N export (28 = $names GPT-2 names) and --init-from: $h (step 3: $at3) $r"
check $r "export / --init-from: params-hash $h != $at3, or $names of 28 tensors named as GPT-2's"
finish "oracle_gpt np $N"

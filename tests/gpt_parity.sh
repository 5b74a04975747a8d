#!/usr/bin/env bash
# gpt_parity.sh TRAIN ZS_CKPT DATA - zs-train-gpt against its PyTorch twin (gpt_torch.py) at 2 ranks, stage 0
# and stage 3: the C program's initial weights are exported to safetensors, the twin starts from them, takes
# the same batches with AdamW, WarmupLR, gradient clipping and gradient accumulation, and the 20 losses and
# the final parameters must agree (tolerances in gpt_torch.py). Exits 77 when torch cannot be imported
# (tools/setup_tests.sh installs it).
set -u
TRAIN=$1 ZS=$2 DATA=$3
PY=$(dirname "$0")/gpt_torch.py
if ! err=$(python3 -c 'import torch' 2>&1); then
  echo "gpt_parity: skipped: torch cannot be imported by python3 (${err##*$'\n'}); bash tools/setup_tests.sh installs it"
  exit 77
fi
. "$(dirname "$0")/lib.sh"
model="--layers 2 --dim 32 --heads 2 --ctx 32 --seed 7"

for stage in 0 3; do
  cat > "$tmp/s$stage.json" <<JSON
{
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
  "steps_per_print": 0,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 5,
                "warmup_type": "linear"}},
  "zero_optimization": {"stage": $stage, "reduce_bucket_size": 3000, "stage3_param_persistence_threshold": 0}
}
JSON
  d=$tmp/s$stage
  run="mpirun --oversubscribe -np 2 $TRAIN --config $d.json --data $DATA $model --val-every 0 --val-batches 1 --sample 0 --quiet"
  # --steps 0 with --save-dir saves the initial weights; then the 20 steps, saved at the end
  if ! $run --steps 0 --save-dir "$d.init" > "$d.log" 2>&1 || ! "$ZS" export "$d.init" "$d.init.st" >> "$d.log" 2>&1 ||
     ! $run --steps 20 --save-dir "$d.final" --metrics "$d.jsonl" >> "$d.log" 2>&1 ||
     ! "$ZS" export "$d.final" "$d.final.st" >> "$d.log" 2>&1; then
    run_failed "stage $stage: $(why_failed "$d.log")"
    continue
  fi
  echo "stage $stage, 2 ranks:"
  python3 "$PY" parity --config "$d.json" --data "$DATA" --world 2 --steps 20 $model --init "$d.init.st" \
    --final "$d.final.st" --metrics "$d.jsonl"
  rc=$?
  check "$([ $rc = 0 ] && echo ok)" "stage $stage: zs-train-gpt and PyTorch differ (exit $rc)"
done
finish gpt_parity

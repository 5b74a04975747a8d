#!/usr/bin/env bash
# window_end.sh TRAIN CMP - the epoch-end remainder (zs_window_end) at 2 ranks: gradient accumulation 3 over
# epochs of 16 micro-batches (windows of 3, 3, 3, 3, 3 and 1 per epoch, as Accelerate and the Trainer cut
# them), 2 epochs. zeroshard.deterministic: stages 1, 2 and 3, stage 3 with the optimizer offloaded to host
# memory, and hybrid sharding at 2 ranks give the 1-rank stage-0 params-hash bit for bit (the exact sums of the
# short windows). The normal mode, whose bits depend on where the micro-batches are summed (oracle.sh): stage
# 1 gives stage 0's hash, stage 3, overlap_comm, optimizer offload to host memory and to NVMe give stage 2's, and
# stage 2 and hybrid sharding stay within 1e-6 of stage 0; a checkpoint saved right after an epoch's short
# window (manifest micro_step 16, not global_step x 3) resumes to the straight run's hash; an epoch that is a
# whole number of windows (15 micro-batches) gives the hash of a run without epochs (a window end at the
# natural end changes nothing), and 16 a different one.
set -u
TRAIN=$1 CMP=$2
STEPS=12 # 2 epochs of 6 windows
. "$(dirname "$0")/lib.sh"

cfg() { # cfg NAME STAGE [EXTRA_ZERO_KEYS] [ZEROSHARD_KEYS]
  cat > "$tmp/$1.json" <<JSON
{
  "train_batch_size": 24, "gradient_accumulation_steps": 3, "gradient_clipping": 0.5, "steps_per_print": 0,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 12}},
  "zero_optimization": {"stage": $2, "overlap_comm": true, "reduce_bucket_size": 1,
                        "stage3_param_persistence_threshold": 0 ${3:-}},
  "zeroshard": {${4:-}}
}
JSON
}

run() { # run N NAME OUT [FLAGS...] -> prints the params-hash or FAILED-OUT; output in $tmp/OUT.out
  local n=$1 name=$2 out=$3 h
  shift 3
  mpirun --oversubscribe -np "$n" "$TRAIN" --config "$tmp/$name.json" --seed 3 --hidden 32 --quiet "$@" \
    > "$tmp/$out.out" 2>&1 || { run_failed "$out at $n ranks: $(why_failed "$tmp/$out.out")"; echo "FAILED-$out"; return; }
  h=$(awk '/^params-hash/ {print $2}' "$tmp/$out.out")
  [ -n "$h" ] || { run_failed "$out printed no params-hash"; h="FAILED-$out"; }
  echo "$h"
}
same() { # same WHAT HASH REF
  local r
  [ "$2" = "$3" ] && [ "${2#FAILED}" = "$2" ] && r=ok || r=bad
  echo "$1: $2 (reference $3) $r"; check $r "$1: params-hash $2 != $3"
}

near() { # near WHAT NAME REF: NAME's parameters within 1e-6 (relative L2) of REF's
  local msg r
  msg=$("$CMP" "$tmp/$2.bin" "$tmp/$3.bin" 1e-6 l2) && r=ok || r=bad
  echo "$1: $msg $r"; check $r "$1: $msg"
}

ep="--epoch-batches 16 --steps $STEPS"
# deterministic mode: every stage and layout, bit for bit, the short windows' exact sums included
det='"deterministic": "world_size_invariant", "micro_shard_size": 1'
cfg d0 0 "" "$det"; cfg d1 1 "" "$det"; cfg d2 2 "" "$det"; cfg d3 3 "" "$det"
cfg d3_cpu 3 ', "offload_optimizer": {"device": "cpu"}' "$det"
cfg d3_hybrid 3 ', "mics_shard_size": 1' "$det"
dref=$(run 1 d0 d0 $ep)
echo "deterministic, stage 0 at 1 rank, epochs of 16 micro-batches: params-hash $dref"
for name in d0 d1 d2 d3 d3_cpu d3_hybrid; do
  same "deterministic $name at 2 ranks" "$(run 2 $name ${name}_np2 $ep)" "$dref"
done

# the normal mode
cfg s0 0; cfg s1 1; cfg s2 2; cfg s3 3
cfg s2_cpu 2 ', "offload_optimizer": {"device": "cpu"}'
mkdir -p "$tmp/nvme"
cfg s3_nvme 3 ', "offload_optimizer": {"device": "nvme", "nvme_path": "'"$tmp/nvme"'"}'
cfg s3_hybrid 3 ', "mics_shard_size": 1'
ref=$(run 2 s0 s0 $ep --dump "$tmp/s0.bin")
echo "stage 0, epochs of 16 micro-batches: params-hash $ref"
same "s1" "$(run 2 s1 s1 $ep)" "$ref"
ref2=$(run 2 s2 s2 $ep --dump "$tmp/s2.bin")
echo "stage 2, epochs of 16 micro-batches: params-hash $ref2"
for name in s3 s2_cpu s3_nvme; do
  same "$name against stage 2" "$(run 2 $name $name $ep)" "$ref2"
done
near "stage 2 against stage 0" s2 s0
run 2 s3_hybrid s3_hybrid $ep --dump "$tmp/s3_hybrid.bin" > /dev/null
near "stage 3 hybrid against stage 0" s3_hybrid s0

# the window's end at the natural end is harmless; a short window is not a full one
same "stage 3, epochs of 15 against no epochs" "$(run 2 s3 s3_e15 --epoch-batches 15 --steps 10)" \
  "$(run 2 s3 s3_plain --steps 10)"
plain=$(run 2 s0 s0_plain --steps $STEPS)
[ "$plain" != "$ref" ] && [ "${plain#FAILED}" = "$plain" ] && r=ok || r=bad
echo "stage 0 without epochs $plain differs from epochs of 16 $ref: $r"
check $r "the short windows changed nothing: --epoch-batches 16 gave the hash of no epochs"

# a checkpoint right after the first epoch's short window (global step 6, micro-batch 16), resumed to 12
run 2 s3 ck_a --epoch-batches 16 --steps 6 --save-dir "$tmp/ck" > /dev/null
micro=$(grep -o '"micro_step": *[0-9]*' "$tmp/ck/global_step6/manifest.json" | grep -o '[0-9]*$')
[ "$micro" = 16 ] && r=ok || r=bad
echo "manifest after the short window: micro_step $micro (16) $r"; check $r "manifest micro_step $micro, expected 16"
same "stage 3 saved after the short window, resumed" "$(run 2 s3 ck_b $ep --load "$tmp/ck")" "$ref2"
finish window_end

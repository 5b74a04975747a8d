#!/usr/bin/env bash
# oracle.sh N TRAIN CMP - the stage oracle at N ranks. With gradient accumulation 1, stages 0-3, overlap
# on and off, and small and large buckets must give bit-identical parameters (same params-hash); with
# accumulation 2 they must agree to 1e-6 (relative L2 norm of the difference); and N ranks must match
# one rank to WORLD_TOL (relative L2). Both comparisons also print the largest element-wise difference.
set -u
N=$1 TRAIN=$2 CMP=$3
WORLD_TOL=${WORLD_TOL:-1e-5}
STEPS=30
. "$(dirname "$0")/lib.sh"

# cfg NAME STAGE OVERLAP BUCKET GAS [OPTIMIZER_AND_SCHEDULER_JSON] [EXTRA_ZERO_KEYS]
cfg() {
  local opt=${6:-'"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5, "total_num_steps": 30, "warmup_type": "linear"}}'}
  cat > "$tmp/$1.json" <<JSON
{
  "train_batch_size": 24,
  "gradient_accumulation_steps": $5,
  "gradient_clipping": 0.5,
  "steps_per_print": 0,
  $opt,
  "zero_optimization": {"stage": $2, "overlap_comm": $3, "reduce_bucket_size": $4,
                        "stage3_param_persistence_threshold": 0 ${7:-}}
}
JSON
}

# run NAME RANKS -> prints the params-hash, leaves $tmp/NAME.bin (ZS_COMM / ZS_FAKE_NODE_SIZE pass through).
# A failed run, or one without a hash, prints FAILED-NAME and is counted as a failure by itself
# (run_failed), so no comparison can pass on two failed runs.
run() {
  local out h
  rm -f "$tmp/$1.bin"
  out=$(mpirun --oversubscribe -np "$2" -x ZS_COMM -x ZS_FAKE_NODE_SIZE "$TRAIN" --config "$tmp/$1.json" \
        --steps $STEPS --seed 3 --hidden 32 --quiet --dump "$tmp/$1.bin" 2>&1)
  if [ $? -ne 0 ]; then run_failed "$1 at $2 ranks: $out"; echo "FAILED-$1"; return; fi
  h=$(echo "$out" | awk '/^params-hash/ {print $2}')
  [ -n "$h" ] || { run_failed "$1 at $2 ranks printed no params-hash: $out"; h="FAILED-$1"; }
  echo "$h"
}

# 1. bit-identical with accumulation 1
cfg ref 0 false 500000000 1
ref=$(run ref "$N")
echo "np $N reference (stage 0) params-hash $ref"
for stage in 0 1 2 3; do
  for ov in false true; do
    for bucket in 1 500000000; do
      # ZS_TEST_QUICK (the sanitizer pass): one bucket size per overlap setting (the optimized pass runs both)
      [ -n "${ZS_TEST_QUICK:-}" ] && { [ $ov = false ] && [ $bucket = 1 ]; } && continue
      [ -n "${ZS_TEST_QUICK:-}" ] && { [ $ov = true ] && [ $bucket != 1 ]; } && continue
      name="s${stage}_ov${ov}_b${bucket}"
      cfg "$name" $stage $ov $bucket 1
      h=$(run "$name" "$N")
      [ "$h" = "$ref" ] && r=ok || r=bad
      echo "np $N stage $stage overlap $ov bucket $bucket: $h $r"
      check $r "$name: params-hash $h != $ref"
    done
  done
done
# stage 3 with no prefetch and a live cap below one unit (every fetch gathers, nothing kept),
# and with prefetch and reuse at their defaults
cfg s3_tight 3 true 1 1 "" ', "stage3_prefetch_bucket_size": 0, "stage3_max_live_parameters": 1, "stage3_max_reuse_distance": 0'
cfg s3_loose 3 true 1 1 "" ', "stage3_prefetch_bucket_size": 100000, "stage3_max_live_parameters": 1000000000'
for name in s3_tight s3_loose; do
  h=$(run $name "$N"); [ "$h" = "$ref" ] && r=ok || r=bad
  echo "np $N $name: $h $r"; check $r "$name: params-hash $h != $ref"
done
# SGD with Nesterov momentum and a cosine schedule, stage 0 against stage 3
sgd='"optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "nesterov": true, "weight_decay": 1e-4}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 30, "warmup_num_steps": 4}}'
cfg sgd0 0 false 500000000 1 "$sgd"; cfg sgd3 3 true 1 1 "$sgd"
h0=$(run sgd0 "$N"); h3=$(run sgd3 "$N")
[ "$h0" = "$h3" ] && r=ok || r=bad
echo "np $N SGD stage 0 $h0 stage 3 $h3 $r"; check $r "SGD stage 3 $h3 != stage 0 $h0"

# Lion and Adagrad: stage 0 against stages 2 and 3
for opt in '"optimizer": {"type": "Lion", "params": {"lr": 0.002, "weight_decay": 0.01}}' \
           '"optimizer": {"type": "Adagrad", "params": {"lr": 0.05, "weight_decay": 0.001}}'; do
  cfg o0 0 false 500000000 1 "$opt"; cfg o2 2 true 1 1 "$opt"; cfg o3 3 true 1 1 "$opt"
  h0=$(run o0 "$N"); h2=$(run o2 "$N"); h3=$(run o3 "$N")
  [ "$h0" = "$h2" ] && [ "$h0" = "$h3" ] && r=ok || r=bad
  echo "np $N $(echo "$opt" | sed 's/.*"type": "\([A-Za-z]*\)".*/\1/') stage 0 $h0 stage 2 $h2 stage 3 $h3 $r"
  check $r "$opt: stages disagree ($h0 $h2 $h3)"
done

# offload to the pinned host pool: optimizer state at stages 1-3, parameter shards too at stage 3
cfg off1 1 true 1 1 "" ', "offload_optimizer": {"device": "cpu", "pin_memory": true}'
cfg off2 2 true 1 1 "" ', "offload_optimizer": {"device": "cpu"}'
cfg off3 3 true 1 1 "" ', "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu", "pin_memory": false}'
for name in off1 off2 off3; do
  h=$(run $name "$N"); [ "$h" = "$ref" ] && r=ok || r=bad
  echo "np $N offload $name: $h $r"; check $r "offload $name: params-hash $h != $ref"
done

# optimizer state on NVMe (a directory on the real disk, so O_DIRECT is in play), small sub-groups so
# the read-ahead / write-behind pipeline runs
nv=$(mktemp -d -p "${ZS_TEST_NVME_DIR:-$PWD}")
for stage in 1 2 3; do
  cfg nvme$stage $stage true 1 1 "" ', "sub_group_size": 700, "offload_optimizer": {"device": "nvme", "nvme_path": "'"$nv"'"}'
  h=$(run nvme$stage "$N"); [ "$h" = "$ref" ] && r=ok || r=bad
  echo "np $N stage $stage offload_optimizer nvme: $h $r"; check $r "nvme stage $stage: params-hash $h != $ref"
done
# stage 3 with parameter shards on NVMe too: read ahead of each fetch, updated in the swap file; a tight
# live cap and two read-ahead buffers (shards read again and again), and a persistence threshold that
# keeps the small output layer in memory next to shards on disk
both='"offload_optimizer": {"device": "nvme", "nvme_path": "'"$nv"'"}, "offload_param": {"device": "nvme", "nvme_path": "'"$nv"'"'
cfg pnvme 3 true 1 1 "" ', "sub_group_size": 700, '"$both"'}'
cfg pnvme_tight 3 true 1 1 "" ', "sub_group_size": 0, "stage3_max_live_parameters": 1, '"$both"', "buffer_count": 2}'
cfg pnvme_mixed 3 true 1 1 "" ', "sub_group_size": 2000, '"$both"'}'
sed -i 's/"stage3_param_persistence_threshold": 0/"stage3_param_persistence_threshold": 200/' "$tmp/pnvme_mixed.json"
for name in pnvme pnvme_tight pnvme_mixed; do
  h=$(run $name "$N"); [ "$h" = "$ref" ] && r=ok || r=bad
  echo "np $N stage 3 offload_param nvme ($name): $h $r"; check $r "$name: params-hash $h != $ref"
done
left=$(find "$nv" -mindepth 1 | wc -l)
[ "$left" = 0 ] && r=ok || r=bad; check $r "nvme runs left $left files behind in $nv"
rm -rf "$nv"

# every collective backend and node layout gives the same bits: MPI only, shared memory, and a forced
# layout of one or two ranks per node (shared memory inside, MPI between)
for env in "ZS_COMM=mpi" "ZS_COMM=shm" "ZS_COMM=shm ZS_FAKE_NODE_SIZE=1" "ZS_COMM=shm ZS_FAKE_NODE_SIZE=2"; do
  for stage in 1 3; do
    # ZS_TEST_QUICK: stage 3 only (the optimized pass runs stage 1 on each backend too)
    [ -n "${ZS_TEST_QUICK:-}" ] && [ $stage = 1 ] && continue
    h=$(env $env bash -c "$(declare -f run cfg run_failed); tmp=$tmp TRAIN=$TRAIN STEPS=$STEPS run s${stage}_ovtrue_b1 $N")
    [ "$h" = "$ref" ] && r=ok || r=bad
    echo "np $N stage $stage $env: $h $r"; check $r "$env stage $stage: params-hash $h != $ref"
  done
done
export ZS_COMM= ZS_FAKE_NODE_SIZE=

# 2. accumulation 2: every stage within 1e-6 of stage 0
cfg gas_s0 0 false 500000000 2
run gas_s0 "$N" > /dev/null
for stage in 1 2 3; do
  cfg "gas_s$stage" $stage true 1 2
  run "gas_s$stage" "$N" > /dev/null
  if msg=$("$CMP" "$tmp/gas_s$stage.bin" "$tmp/gas_s0.bin" 1e-6 l2); then r=ok; else r=bad; fi
  echo "np $N accumulation 2 stage $stage vs stage 0: $msg $r"
  check $r "accumulation 2 stage $stage: $msg"
done
# ... and with the optimizer on NVMe, where stages 2-3 stream the gradient shards to the swap file and add each
# micro-batch to the shard read back: bit-identical to the same stage in memory
nv=$(mktemp -d -p "${ZS_TEST_NVME_DIR:-$PWD}")
for stage in 2 3; do
  h0=$(run "gas_s$stage" "$N")
  cfg "gas_nvme$stage" $stage true 1 2 "" ', "sub_group_size": 700, "offload_optimizer": {"device": "nvme", "nvme_path": "'"$nv"'"}'
  h=$(run "gas_nvme$stage" "$N"); [ "$h" = "$h0" ] && r=ok || r=bad
  echo "np $N accumulation 2 stage $stage offload_optimizer nvme: $h vs $h0 in memory $r"
  check $r "accumulation 2 stage $stage nvme: params-hash $h != $h0"
done
rm -rf "$nv"

# 3. world size: N ranks against one rank, same global batch
if [ "$N" -gt 1 ]; then
  run ref 1 > /dev/null; cp "$tmp/ref.bin" "$tmp/one.bin"
  run ref "$N" > /dev/null
  if msg=$("$CMP" "$tmp/ref.bin" "$tmp/one.bin" "$WORLD_TOL" l2); then r=ok; else r=bad; fi
  echo "np $N vs np 1 after $STEPS steps: $msg $r"
  check $r "world size $N vs 1: $msg"
fi
finish "oracle np $N"

#!/usr/bin/env bash
# quant_fault.sh TRAIN - a parameter shard that rank 0 cannot read (ZS_TEST_SWAP_FAULT=read:EIO:0 on rank 0 only)
# at stage 3 with offload_param and offload_optimizer on NVMe, 4 ranks in two forced nodes of 2: with and without
# zero_quantized_weights each of the 3 other ranks ends the fetch with an error naming rank 0 at once (the failed
# gather carries it: the quantized gather's two phases, or the plain gather's header to the other node,
# sharding/fetch.c), not at the comm's timeout (ZS_TIMEOUT 120; the run must end well before it, and no error is
# a timeout's). Every peer's line is printed: a failing example waits for the others before it aborts.
set -u
TRAIN=$1
source "$(dirname "$0")/lib.sh"
for q in false true; do
  nv=$(mktemp -d -p "$tmp")
  cat > "$tmp/q_$q.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "zero_quantized_weights": $q,
  "offload_optimizer": {"device": "nvme", "nvme_path": "$nv"}, "offload_param": {"device": "nvme", "nvme_path": "$nv"}}}
JSON
  args=(--config "$tmp/q_$q.json" --steps 3 --quiet --hidden 32 --layers 2)
  t0=$(date +%s)
  env=(-x ZS_FAKE_NODE_SIZE=2 -x ZS_TIMEOUT=120) # each app context's own (a -x before the first is not every one's)
  timeout 300 mpirun --oversubscribe -np 1 "${env[@]}" -x ZS_TEST_SWAP_FAULT=read:EIO:0 "$TRAIN" "${args[@]}" \
    : -np 3 "${env[@]}" "$TRAIN" "${args[@]}" > "$tmp/q_$q.out" 2>&1
  rc=$? t=$(($(date +%s) - t0))
  own=$(grep -c "^zeroshard: error: .*optimizer.swap: read at offset 0 .*Input/output error" "$tmp/q_$q.out")
  peers=$(grep -c "^zeroshard: error: .* unit 'layer0': .*rank 0 could not take part" "$tmp/q_$q.out")
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$own" -ge 1 ] && [ "$peers" -eq 3 ] && [ $t -lt 60 ] &&
    ! grep -q "^zeroshard: error: .*timeout" "$tmp/q_$q.out" && r=ok || r=bad
  echo "zero_quantized_weights $q: rc $rc after ${t}s, rank 0's error $own, peers naming rank 0 $peers: $r"
  check $r "zero_quantized_weights $q: $(grep -m3 -e error -e timeout "$tmp/q_$q.out" | tr '\n' ' ')"
done
finish quant_fault

#!/usr/bin/env bash
# quant_engine.sh TRAIN - zero_quantized_weights and zero_quantized_gradients in the engine (sharding/quant_path.c),
# stage 3 of zs-train-mlp. Four ranks in two forced nodes of 2 (ZS_FAKE_NODE_SIZE=2): the loss of each of 5 steps
# within 2e-2 of the unquantized run's (the int8 blocks' error on parameters and gradients; measured up to 4.7e-3 by
# the sixth step, 1.3e-3 by the fifth), and the counted cross-node bytes at most a quarter of it (int8 for fp32, and one peer per local index
# instead of every rank of the other node). One node (2 ranks): the exact collectives, so the unquantized params-hash.
# And the keys refused by name where they do not apply (quantized weights at stage 2, hpZ groups across nodes).
set -u
TRAIN=$1
source "$(dirname "$0")/lib.sh"
cfg() { # name stage extra
  cat > "$tmp/$1.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": $2, "stage3_param_persistence_threshold": 0 $3}}
JSON
}
cfg off 3 ''
cfg on 3 ', "zero_quantized_weights": true, "zero_quantized_gradients": true'
cfg stage2 2 ', "zero_quantized_weights": true'
cfg hpz 3 ', "zero_quantized_weights": true, "zero_hpz_partition_size": 2'
run() { # name config ranks env...
  local name=$1 config=$2 np=$3
  shift 3
  mpirun --oversubscribe -np "$np" "$@" "$TRAIN" --config "$tmp/$config.json" --steps 5 --quiet --hidden 32 --layers 2 \
    > "$tmp/$name.out" 2>&1
}
losses() { sed -n 's/^step [0-9]* loss \([0-9.]*\) .*/\1/p' "$tmp/$1.out" | tr '\n' ' '; }
cross() { sed -n 's/^traffic: cross-node \([0-9]*\) .*/\1/p' "$tmp/$1.out"; }
hash_of() { sed -n 's/^params-hash //p' "$tmp/$1.out"; }

run off2 off 4 -x ZS_FAKE_NODE_SIZE=2 || run_failed "unquantized, nodes of 2: $(why_failed "$tmp/off2.out")"
run on2 on 4 -x ZS_FAKE_NODE_SIZE=2 || run_failed "quantized, nodes of 2: $(why_failed "$tmp/on2.out")"
r=$(python3 - "$(losses off2)" "$(losses on2)" <<'PY'
import sys
a, b = ([float(x) for x in s.split()] for s in sys.argv[1:3])
d = max((abs(x - y) for x, y in zip(a, b)), default=None)
print("ok" if len(a) == 5 and len(b) == 5 and d is not None and d <= 2e-2 else "bad", d)
PY
)
echo "nodes of 2: losses $(losses on2)against $(losses off2)(largest difference ${r#* }): ${r%% *}"
check "${r%% *}" "quantized losses differ by more than 2e-2: ${r#* }"
c0=$(cross off2) c1=$(cross on2)
[ -n "$c0" ] && [ -n "$c1" ] && [ "$c1" -gt 0 ] && [ $((c1 * 4)) -le "$c0" ] && r=ok || r=bad
echo "cross-node bytes/step/rank: unquantized $c0, quantized $c1: $r"
check $r "cross-node bytes: quantized '$c1' is not at most a quarter of '$c0'"
run off1 off 2 || run_failed "unquantized, one node: $(why_failed "$tmp/off1.out")"
run on1 on 2 || run_failed "quantized, one node: $(why_failed "$tmp/on1.out")"
h0=$(hash_of off1) h1=$(hash_of on1)
[ -n "$h0" ] && [ "$h0" = "$h1" ] && r=ok || r=bad
echo "one node: params-hash $h1, unquantized $h0: $r"
check $r "one node: the quantized keys changed the params-hash ($h1, unquantized $h0)"
run stage2 stage2 4 -x ZS_FAKE_NODE_SIZE=2 && r=bad || { grep -q "zero_optimization.zero_quantized_weights: .*stage 3" "$tmp/stage2.out" && r=ok || r=bad; }
echo "stage 2 with zero_quantized_weights: $(grep -m1 'error' "$tmp/stage2.out"): $r"
check $r "stage 2 with zero_quantized_weights was not refused by name"
# hpZ's secondary group across nodes (nodes of 1): its slice would come from the quantized gather's buffer, exact
# for this node's shards only (other bits in forward and backward); refused naming both keys
run hpz1 hpz 4 -x ZS_FAKE_NODE_SIZE=1 && r=bad || {
  grep -q "zero_optimization.zero_hpz_partition_size 2 with zero_optimization.zero_quantized_weights: .*crosses nodes" \
    "$tmp/hpz1.out" && r=ok || r=bad; }
echo "hpZ 2 across nodes of 1 with zero_quantized_weights: $(grep -m1 'error' "$tmp/hpz1.out"): $r"
check $r "hpZ across nodes with zero_quantized_weights was not refused naming both keys"
finish quant_engine

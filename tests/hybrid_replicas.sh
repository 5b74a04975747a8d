#!/usr/bin/env bash
# hybrid_replicas.sh TRAIN CMP - hybrid sharding with more than two replicas, outside network namespaces: shard
# groups of 2 (mics_shard_size 2) on forced nodes of 2 at 6 ranks (3 replicas) and 8 ranks (4 replicas), normal
# mode, stages 1 and 3, within 1e-5 (l2) of the flat run at the same ranks (the non-hybrid oracle; the cross-group
# sum only reorders the additions). At 2x2 the replicas' all-reduce count (shard / replicas) equals shard / group
# size, so hybrid_mlp cannot tell them apart; here they differ.
set -u
TRAIN=$1 CMP=$2
. "$(dirname "$0")/lib.sh"
export ZS_FAKE_NODE_SIZE=2 ZS_TIMEOUT=${ZS_TIMEOUT:-120} # a hang fails in bounded time
cfg() { # cfg NAME STAGE [EXTRA_ZERO_KEYS]
  cat > "$tmp/$1.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.05, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
 "zero_optimization": {"stage": $2, "reduce_bucket_size": 500, "stage3_param_persistence_threshold": 0 ${3:-}}}
JSON
}
run() { # run N NAME -> $tmp/NAME.N.bin (a failed run is recorded)
  mpirun --oversubscribe -np "$1" "$TRAIN" --config "$tmp/$2.json" --steps 6 --hidden 32 --layers 2 \
    --dump "$tmp/$2.$1.bin" > "$tmp/$2.$1.out" 2>&1 || run_failed "$2 at $1 ranks: $(why_failed "$tmp/$2.$1.out")"
}
for s in 1 3; do
  cfg f$s $s; cfg h$s $s ', "mics_shard_size": 2'
  for n in 6 8; do
    run "$n" f$s; run "$n" h$s
    grep -q "hybrid: $((n / 2)) groups of 2 ranks" "$tmp/h$s.$n.out" && layout=ok || layout=bad
    out=$("$CMP" "$tmp/h$s.$n.bin" "$tmp/f$s.$n.bin" 1e-5 l2 2>&1) && [ $layout = ok ] && r=ok || r=bad
    echo "stage $s, $n ranks, $((n / 2)) replicas of 2 vs flat: $out (layout line: $layout) $r"
    check $r "stage $s at $n ranks: hybrid vs flat: $out (layout: $layout)"
  done
done
finish hybrid_replicas

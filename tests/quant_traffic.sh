#!/usr/bin/env bash
# quant_traffic.sh TRAIN - the library's traffic counter on a flat stage-3 run of zs-train-mlp at 4 ranks, two
# forced nodes of 2 (ZS_FAKE_NODE_SIZE=2), against what the algorithm must send, derived here from the model:
# units of P = 16H+H, H*H+H, 4H+4 parameters (--hidden H, --layers 2), each sharded into s = ceil(P/4) rounded up
# to 16 elements (core/partition.c). A rank sends its fp32 shard (all-gather) or chunk (reduce-scatter) of s
# elements to each of the 2 ranks on the other node (cross) and the 1 on its own (intra). Each step gathers every
# unit in forward and reduce-scatters its gradients in backward; the first step gathers every unit again in
# backward (no fetch trace yet; later steps reuse forward's gather: stage3_max_reuse_distance 1e9); each step ends
# with two 2-float all-gathers (the gradient norm's partials, the example's loss). With ZS_COMM=mpi every peer is
# its own node: all three peers count as cross-node.
set -u
TRAIN=$1
source "$(dirname "$0")/lib.sh"
H=24
cat > "$tmp/z3.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 1e9,
                       "stage3_max_live_parameters": 1e9}}
JSON
# expected STEPS REMOTE LOCAL: "cross intra" as the example prints them (means over ranks and steps, %.0f)
expected() {
  python3 - "$H" "$@" <<'PY'
import sys
h, k, remote, local = (int(a) for a in sys.argv[1:])
S = sum(-(-(-(-p // 4)) // 16) * 16 for p in (16 * h + h, h * h + h, 4 * h + 4))
per_peer = 4 * S * (2 * k + 1) + 4 * 2 * 2 * k   # bytes to one peer over k steps
print("%.0f %.0f" % (remote * per_peer / k, local * per_peer / k))
PY
}
measure() { # STEPS env...
  local k=$1
  shift
  mpirun --oversubscribe -np 4 "$@" "$TRAIN" --config "$tmp/z3.json" --steps "$k" --quiet --hidden $H --layers 2 \
    > "$tmp/out" 2>&1 || { run_failed "$* --steps $k: $(why_failed "$tmp/out")"; return; }
  sed -n 's/^traffic: cross-node \([0-9]*\) bytes\/step\/rank intra-node \([0-9]*\) bytes\/step\/rank$/\1 \2/p' "$tmp/out"
}
for k in 3; do
  got=$(measure $k -x ZS_FAKE_NODE_SIZE=2) want=$(expected $k 2 1)
  [ -n "$got" ] && [ "$got" = "$want" ] && r=ok || r=bad
  echo "nodes of 2, $k steps: cross intra $got, derived $want: $r"
  check $r "nodes of 2, $k steps: counted '$got', derived '$want'"
done
got=$(measure 3 -x ZS_COMM=mpi) want=$(expected 3 3 0)
[ -n "$got" ] && [ "$got" = "$want" ] && r=ok || r=bad
echo "ZS_COMM=mpi, 3 steps: cross intra $got, derived $want: $r"
check $r "ZS_COMM=mpi: counted '$got', derived '$want'"
finish quant_traffic

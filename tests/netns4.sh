#!/usr/bin/env bash
# netns4.sh MLP CMP CONFIG_CHECK - 4 nodes x 2 ranks: four network namespaces on a bridge (netns_lib.sh),
# Open MPI on 8 ranks, shared memory inside each node and TCP between. Checks: Open MPI and ZeroShard both
# see 4 nodes of 2; stages 0 and 3 across the nodes give the one-node 8-rank run's params-hash; a node
# whose link goes down mid-run is named by every other rank within ZS_TIMEOUT and no rank is left running.
# The hybrid (deterministic: the 1-rank hash; normal: within 1e-5 of stage 0) and quantized (within their
# lossy tolerance) configs run here too; hpZ, refused by the library today, prints "SKIP <name>: refused: <error>". Skips (77) where namespaces cannot be made.
set -u
MLP=$1 CMP=$2 CONFIG_CHECK=$3
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns_lib.sh"
trap 'ns_teardown; rm -rf "$tmp"' EXIT
ns_setup 4 2 || { echo "SKIP: $ns_why"; exit 77; }

STEPS=12
# cfg NAME STAGE [EXTRA_ZERO_KEYS] [EXTRA_TOP_LEVEL_KEYS]
cfg() {
  cat > "$tmp/$1.json" <<JSON
{"train_batch_size": 16, "gradient_accumulation_steps": 1, "steps_per_print": 0, ${4:-}
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": $2, "stage3_param_persistence_threshold": 0 ${3:-}}}
JSON
}
args() { echo --config "$tmp/$1.json" --hidden 16 --seed 3 --steps $STEPS ${LOUD:---quiet} --dump "$tmp/$1.bin"; }
hash_of() { awk '/^params-hash/ {print $2}' "$tmp/$1.log"; }
# nodes NAME [-x VAR=V]...: NAME's config across the 4 nodes; its output in $tmp/NAME.log, its hash printed
nodes() {
  local name=$1; shift
  ns_mpirun "$@" -- "$MLP" $(args $name) > "$tmp/$name.log" 2>&1 || run_failed "$name across 4 nodes: $(why_failed "$tmp/$name.log")"
  hash_of $name
}
same() { # LABEL GOT WANT
  [ -n "$2" ] && [ "$2" = "$3" ] && r=ok || r=bad
  echo "$1: $2 (want $3) $r"; check $r "$1: params-hash '$2' != '$3'"
}

# (a) the oracle: the one-node 8-rank run's hash, then stages 0 and 3 across the nodes
cfg s0 0; cfg s3 3
timeout -k 5 120 mpirun --oversubscribe -np 8 "$MLP" $(args s0) > "$tmp/one.log" 2>&1 || run_failed "one node: $(why_failed "$tmp/one.log")"
ref=$(hash_of one)
echo "one node, 8 ranks, stage 0: $ref"
LOUD=" " NS_MPI_FLAGS="--display-map --mca btl_base_verbose 1" nodes s3 > /dev/null
sed -n '/JOB MAP/,/=======$/p' "$tmp/s3.log" | grep -E 'Data for node|rank:' | sed 's/ *Process OMPI jobid: [^ ]* App: 0 / /'
grep -m1 'collectives:' "$tmp/s3.log"; grep -m1 'optimizer kernels:' "$tmp/s3.log"
# Open MPI's choice per peer: each rank reaches 1 peer by shared memory (vader) and 6 by TCP
vader=$(grep -c 'bml: Using vader btl' "$tmp/s3.log") tcp=$(grep -c 'bml: Using tcp btl' "$tmp/s3.log")
echo "Open MPI's transports per pair of ranks: vader $vader, tcp $tcp (4 nodes of 2: 8 and 48)"
[ "$vader" = 8 ] && [ "$tcp" = 48 ] && r=ok || r=bad; check $r "Open MPI did not see 4 nodes of 2 (vader $vader, tcp $tcp)"
grep -q 'collectives: shm+mpi (4 nodes, shared memory inside' "$tmp/s3.log" &&
  grep -q '(2 ranks on this node)' "$tmp/s3.log" && r=ok || r=bad
check $r "ZeroShard did not see 4 nodes of 2: $(grep -m1 'collectives:' "$tmp/s3.log")"
same "4 nodes x 2 ranks, stage 3" "$(hash_of s3)" "$ref"
same "4 nodes x 2 ranks, stage 0" "$(nodes s0)" "$ref"

# (c) the configs of the other parts of scaling past one node: checked where they run, SKIP where refused.
# extra NAME HOW CONFIG_KEYS... -- HOW: "hash" (deterministic: the 1-rank deterministic hash) or "tol T"
# (relative L2 against the one-node stage 0 parameters)
det='"zeroshard": {"deterministic": "world_size_invariant", "micro_shard_size": 1},'
extra() {
  local name=$1 how=$2 msg want
  cfg "$name" 3 "$3" "${4:-}"
  if ! msg=$("$CONFIG_CHECK" --world 8 "$tmp/$name.json" 2>&1); then
    echo "SKIP $name: refused: $(echo "$msg" | grep -m1 error | sed 's/^[^:]*: *error: *//')"
    return
  fi
  # Known open bug: a hybrid / hpZ run across the 4 netns nodes sometimes stalls until its time limit (seen in
  # 2 of 3 runs at ffda5be too; tests/README.md). One retry, announced, so the stall stays visible in the log;
  # two in a row fail the test.
  if ! ns_mpirun -- "$MLP" $(args "$name") > "$tmp/$name.log" 2>&1; then
    echo "RETRY $name: the first run across 4 nodes failed or stalled: $(why_failed "$tmp/$name.log")"
    nodes "$name" > /dev/null
  fi
  if [ "$how" = hash ]; then
    cfg "${name}_1" 3 "" "$4"
    timeout -k 5 60 "$MLP" $(args "${name}_1") > "$tmp/${name}_1.log" 2>&1 || run_failed "$name at 1 rank"
    same "$name: 4 nodes vs 1 rank, deterministic" "$(hash_of "$name")" "$(hash_of "${name}_1")"
  else
    msg=$("$CMP" "$tmp/$name.bin" "$tmp/s0.bin" "${how#tol }" l2) && r=ok || r=bad
    echo "$name: against stage 0: $msg $r"; check $r "$name: $msg"
  fi
}
extra hybrid_mics2 hash ', "mics_shard_size": 2' "$det"
extra hybrid_mics2_normal "tol 1e-5" ', "mics_shard_size": 2'
extra hybrid_hpz2 hash ', "zero_hpz_partition_size": 2' "$det"
# int8 blocks across nodes are lossy (docs/config.md): parameters after the run's steps, measured 2.7e-2 (weights:
# every rank computes with quantized copies of 3 other nodes' shards) and 1.8e-3 (gradients) in relative L2
extra quant_weights "tol 5e-2" ', "zero_quantized_weights": true'
extra quant_grads "tol 1e-2" ', "zero_quantized_gradients": true'

# (b) node 3 (ranks 6 and 7) loses its link mid-run: every other rank's error names 6 and 7 and node 3's host within
# ZS_TIMEOUT, and no rank is left running. mpirun cannot reach node 3's daemon any more and waits for it:
# ending the launcher is the namespaces' clean-up.
NS_LIMIT=60 ns_mpirun -x ZS_TIMEOUT=3 -- "$MLP" --config "$tmp/s3.json" --hidden 16 --seed 3 --steps 100000 > "$tmp/down.log" 2>&1 &
job=$!
ns_cut "$tmp/down.log" 5 3
left=
for _ in $(seq 50); do # the ranks end by themselves (MPI_Abort reaches each node's daemon but node 3's)
  left=$(for p in $(ns_pids); do [ "$(cat /proc/$p/comm 2> /dev/null)" = "${MLP##*/}" ] && echo $p; done)
  [ -z "$left" ] && break; sleep 0.1
done
grep -m1 'zeroshard: error' "$tmp/down.log"
# node 3's ranks, both or the one whose part had not arrived yet when the link went (6's may have), and its host
lost="ranks not arrived: (6, 7|6|7) \\(host $(ns_name 3)\\)"
named=$(grep -Ec "rank [0-5]: timeout: .*$lost\$" "$tmp/down.log")
other=$(grep 'rank [0-5]: timeout' "$tmp/down.log" | grep -Evc "$lost\$")
echo "node 3's link down: the first error after $ns_cut_s s; $named of ranks 0-5 named ranks of node 3 and its host $(ns_name 3), $other named others"
[ "$named" -ge 1 ] && [ "$other" = 0 ] && r=ok || r=bad
check $r "node down: no error naming ranks 6, 7 and their host: $(why_failed "$tmp/down.log")"
echo "ranks still running 5 s after the first error: ${left:-none} (the launcher's left: $(for p in $(ns_pids); do cat /proc/$p/comm; done 2> /dev/null | tr '\n' ' '))"
[ -z "$left" ] && r=ok || r=bad; check $r "node down: ranks left running: $left"
ns_reap $job
[ -z "$ns_left" ] && r=ok || r=bad; check $r "node down: processes left in the namespaces: $ns_left"
finish netns4

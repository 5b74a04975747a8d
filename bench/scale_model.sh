#!/usr/bin/env bash
# scale_model.sh [BUILD] - checks zs-estimate --time against measured steps of zs-train-mlp (stage 3):
# 1-4 ranks on this machine, then two "nodes" (network namespaces joined by a veth pair, Open MPI launched
# into each) with the link held to a few rates by tc tbf so that communication dominates. The model gets
# the measured inputs: one rank's compute rate, zs-bench comm's shared-memory bandwidth and latency, the
# link's rate as set and its latency as measured. Prints predicted vs measured (median of REPS runs,
# cases interleaved) and the error of each. Needs root for the namespaces (skipped otherwise).
#   REPS=5 STEPS=10 HIDDEN=256 LAYERS=4 MB=64 RATES="10 50 200" CORES=$(nproc) bash bench/scale_model.sh build
set -u
B=${1:-build}
REPS=${REPS:-5} STEPS=${STEPS:-10} HIDDEN=${HIDDEN:-256} LAYERS=${LAYERS:-4} MB=${MB:-64}
RATES=${RATES:-10 50 200} CORES=${CORES:-$(nproc)}
MLP=$B/zs-train-mlp EST=$B/zs-estimate BENCH=$B/zs-bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
A=zsma$$ Bn=zsmb$$ NET=10.78.$(( $$ % 200 + 20 ))
IPA=$NET.1 IPB=$NET.2
cleanup() {
  for ns in $A $Bn; do
    pids=$(ip netns pids $ns 2>/dev/null); [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del $ns 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
cat > "$tmp/c.json" <<JSON
{"train_micro_batch_size_per_gpu": $MB, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
JSON
train=(--config "$tmp/c.json" --hidden $HIDDEN --layers $LAYERS --quiet --seed 3)
# median step time in seconds of one run's log, the first two (warm-up) steps left out
step_median() { awk '/^step / {for (i = 1; i < NF; i++) if ($i == "time") {sub("s", "", $(i + 1)); if (++n > 2) print $(i + 1)}}' "$1" |
  sort -g | awk '{v[NR] = $1} END {if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
# busbw (bytes/s, from the median time) and the median time (s) of one op and size in zs-bench comm's JSON
comm_fit() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l)
        if r["op"] == sys.argv[2] and r["impl"] == "zeroshard" and r["bytes"] == int(sys.argv[3]):
            t = r["time_us_median"] * 1e-6
            print((r["ranks"] - 1) / r["ranks"] * r["bytes"] / t, t)' "$@"; }

echo "# machine: $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "# command: REPS=$REPS STEPS=$STEPS HIDDEN=$HIDDEN LAYERS=$LAYERS MB=$MB RATES=\"$RATES\" CORES=$CORES bash bench/scale_model.sh $B"
P=$("$EST" --time --json --mlp $HIDDEN,$LAYERS --gpus 1 | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["time_model"]["params"]))')
S=$((P * 4))
echo "# zs-train-mlp --hidden $HIDDEN --layers $LAYERS: $P parameters ($S bytes fp32), stage 3, micro-batch $MB, $STEPS steps a run"

median() { sort -g | awk '{v[NR] = $1} END {if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
# the shared-memory collectives at 2 ranks, bandwidth at the model's size and latency at 1 KiB: measured
# once a rep between the runs (the machine's load moves), the median taken
shm_probe() {
  mpirun -np 2 "$BENCH" comm --sizes 1K,$S --ops all_gather --impl zeroshard --min-time 0.2 > "$tmp/shm.json" 2>&1
  read -r bw _ <<< "$(comm_fit "$tmp/shm.json" all_gather $S)"
  read -r _ lat <<< "$(comm_fit "$tmp/shm.json" all_gather 1024)"
  echo "shm_bw $bw" >> "$tmp/results"; echo "shm_lat $lat" >> "$tmp/results"
}

# the namespaces (tests/netns.sh's set-up): a veth pair, Open MPI's rsh agent entering the namespace
netns=1
{ ip netns add $A && ip netns add $Bn && ip link add v$A type veth peer name v$Bn &&
  ip link set v$A netns $A && ip link set v$Bn netns $Bn &&
  ip -n $A addr add $IPA/24 dev v$A && ip -n $Bn addr add $IPB/24 dev v$Bn &&
  ip -n $A link set v$A up && ip -n $Bn link set v$Bn up && ip -n $A link set lo up && ip -n $Bn link set lo up; } 2> "$tmp/nserr" ||
  { netns=0; echo "# namespaces not available ($(head -1 "$tmp/nserr")): the two-node cases are not run"; }
cat > "$tmp/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case \$host in $IPA) ns=$A ;; $IPB) ns=$Bn ;; *) exit 1 ;; esac
exec ip netns exec \$ns sh -c "\$*"
AGENT
chmod +x "$tmp/agent"
printf '%s slots=1\n%s slots=1\n' $IPA $IPB > "$tmp/hosts"
two_nodes() {
  timeout -k 5 300 ip netns exec $A mpirun -np 2 --hostfile "$tmp/hosts" --map-by node \
    --mca plm_rsh_agent "$tmp/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include $NET.0/24 --mca btl tcp,self --mca btl_tcp_if_include $NET.0/24 \
    -x PATH -x LD_LIBRARY_PATH "$@"; }
limit() { # RATE (Mbit/s): both directions
  for x in "$A v$A" "$Bn v$Bn"; do set -- $x
    ip netns exec $1 tc qdisc replace dev $2 root tbf rate ${RATE}mbit burst 64kb latency 500ms || return 1
  done; }
if [ $netns = 1 ]; then
  for RATE in $RATES; do
    limit || { netns=0; echo "# tc tbf not available: the two-node cases are not run"; break; }
    two_nodes "$BENCH" comm --sizes $S --ops all_gather --impl zeroshard --min-time 0.5 --warmup 1 > "$tmp/tbf$RATE.json" 2>&1
    read -r bw _ <<< "$(comm_fit "$tmp/tbf$RATE.json" all_gather $S)"
    eval "BW$RATE=$bw"
    echo "# tbf rate $RATE Mbit/s: zs-bench comm all_gather busbw $(python3 -c "print(f'{$bw*8/1e6:.1f}')") Mbit/s (payload)"
  done
fi

tcp_probe() { # the latency across the namespaces: a 1 KiB all_gather over TCP, no limit on the link
  for x in "$A v$A" "$Bn v$Bn"; do set -- $x; ip netns exec $1 tc qdisc del dev $2 root 2> /dev/null; done
  two_nodes "$BENCH" comm --sizes 1K --ops all_gather --impl zeroshard --min-time 0.2 > "$tmp/tcp.json" 2>&1
  read -r _ lat <<< "$(comm_fit "$tmp/tcp.json" all_gather 1024)"
  echo "tcp_lat $lat" >> "$tmp/results"
}

# the runs, interleaved: every rep runs every case once
: > "$tmp/results"
for rep in $(seq "$REPS"); do
  shm_probe
  [ $netns = 1 ] && tcp_probe
  for n in 1 2 3 4; do
    mpirun -np $n "$MLP" "${train[@]}" --steps $STEPS > "$tmp/run.log" 2>&1 &&
      echo "node$n $(step_median "$tmp/run.log")" >> "$tmp/results" || echo "# run failed: $n ranks: $(tail -1 "$tmp/run.log")"
  done
  # the machine's share for us: as many one-rank jobs as cores at once, no communication between them
  for i in $(seq "$CORES"); do mpirun -np 1 "$MLP" "${train[@]}" --steps $STEPS > "$tmp/indep$i.log" 2>&1 & done
  wait
  for i in $(seq "$CORES"); do echo "indep $(step_median "$tmp/indep$i.log")"; done >> "$tmp/results"
  if [ $netns = 1 ]; then
    for RATE in $RATES; do
      limit && two_nodes "$MLP" "${train[@]}" --steps $STEPS > "$tmp/run.log" 2>&1 &&
        echo "tbf$RATE $(step_median "$tmp/run.log")" >> "$tmp/results" || echo "# run failed: $RATE Mbit/s: $(tail -1 "$tmp/run.log")"
    done
  fi
done

# the model, fed the measured inputs; compute rate from one rank's step (compute + optimizer)
INTRA_BW=$(awk '$1 == "shm_bw" {print $2}' "$tmp/results" | median)
INTRA_LAT=$(awk '$1 == "shm_lat" {print $2}' "$tmp/results" | median)
echo "# zs-bench comm, 2 ranks, shm all_gather (median of $REPS): busbw $(python3 -c "print(f'{$INTRA_BW/1e9:.3f}')") GB/s at $S B, $(python3 -c "print(f'{$INTRA_LAT*1e6:.1f}')") us at 1 KiB"
if [ $netns = 1 ]; then
  INTER_LAT=$(awk '$1 == "tcp_lat" {print $2}' "$tmp/results" | median)
  echo "# zs-bench comm across the namespaces (TCP, no limit, median of $REPS): all_gather $(python3 -c "print(f'{$INTER_LAT*1e6:.1f}')") us at 1 KiB"
fi
t1=$(awk '$1 == "node1" {print $2}' "$tmp/results" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
FLOPS=$(python3 -c "print(6 * $P * $MB / $t1)")
echo "# one rank: median step $t1 s => compute rate $(python3 -c "print(f'{$FLOPS/1e9:.3f}')") GFLOP/s (6 * params * micro-batch / step)"
ti=$(awk '$1 == "indep" {print $2}' "$tmp/results" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
EFF=$(python3 -c "print(min($CORES, $CORES * $t1 / $ti))")
echo "# $CORES one-rank jobs at once: median step $ti s => the other users leave us $(python3 -c "print(f'{$EFF:.2f}')") of $CORES cores (--cores)"
base=(--time --json --mlp $HIDDEN,$LAYERS --micro-batch $MB --dtype fp32 --stage 3 --flops $FLOPS --mem-bw 10
      --intra-bw $(python3 -c "print($INTRA_BW/1e9)") --intra-lat $(python3 -c "print($INTRA_LAT*1e6)"))
predict() { "$EST" "${base[@]}" "$@" | python3 -c 'import json,sys; r=json.load(sys.stdin)["time_model"]["rows"][0]; print(r["step_s"], r["compute_s"], r["comm_exposed_s"])'; }
printf '\n%-34s %10s %10s %8s   %s\n' case predicted measured error "model inputs beyond the base"
for c in $(awk '{print $1}' "$tmp/results" | sort -u); do
  case $c in
    indep | shm_* | tcp_*) continue ;;
    node*) n=${c#node}; extra=(--gpus $n --ranks-per-node 8 --cores $EFF)
           what="$n rank(s), one node" ;;
    tbf*) r=${c#tbf}; extra=(--gpus 2 --ranks-per-node 1 --cores $(python3 -c "print($EFF / 2)") --inter-bw $(python3 -c "print($r / 8 / 1000)")
                             --inter-lat $(python3 -c "print($INTER_LAT*1e6)"))
           what="2 nodes x 1 rank, link $r Mbit/s" ;;
  esac
  read -r pred pc pe <<< "$(predict "${extra[@]}")"
  meas=$(awk -v c=$c '$1 == c {print $2}' "$tmp/results" | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}')
  runs=$(awk -v c=$c '$1 == c' "$tmp/results" | wc -l)
  err=$(python3 -c "print(f'{($pred - $meas) / $meas * 100:+.1f}%')")
  printf '%-34s %8.1fms %8.1fms %8s   %s\n' "$what" "$(python3 -c "print($pred*1e3)")" "$(python3 -c "print($meas*1e3)")" "$err" "${extra[*]}"
  if [ "${c#tbf}" != "$c" ]; then # again with zs-bench comm's busbw under the limit instead of the rate set
    eval "bw=\$BW${c#tbf}"
    extra[7]=$(python3 -c "print($bw / 1e9)")
    read -r pred2 _ <<< "$(predict "${extra[@]}")"
    printf '%-34s %8.1fms %8.1fms %8s   %s\n' "  same, zs-bench's busbw" "$(python3 -c "print($pred2*1e3)")" "$(python3 -c "print($meas*1e3)")" \
      "$(python3 -c "print(f'{($pred2 - $meas) / $meas * 100:+.1f}%')")" "${extra[*]}"
  fi
  echo "{\"bench\": \"scale_model\", \"case\": \"$c\", \"predicted_s\": $pred, \"compute_s\": $pc, \"comm_exposed_s\": $pe, \"measured_s\": $meas, \"runs\": $runs}" >> "$tmp/json"
done
# the link's share of the step: measured = a + b / R over the rates R, b against the model's bytes out of a node
if [ $netns = 1 ] && [ $(echo $RATES | wc -w) -ge 2 ]; then
  xb=$("$EST" "${base[@]}" --gpus 2 --ranks-per-node 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["time_model"]["rows"][0]["cross_node_bytes"])')
  python3 - "$tmp/json" "$xb" <<'FIT'
import json, sys
pts = [(1 / float(r["case"][3:]), r["measured_s"]) for r in map(json.loads, open(sys.argv[1])) if r["case"].startswith("tbf")]
n = len(pts); mx = sum(x for x, _ in pts) / n; my = sum(y for _, y in pts) / n
b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts); a = my - b * mx
got = b * 1e6 / 8  # s * Mbit/s -> bytes
print(f"# fit over the link rates: measured = {a * 1e3:.0f} ms + {got / 1e3:.0f} KB / rate each way a step; "
      f"the model's bytes out of a node {float(sys.argv[2]) / 1e3:.0f} KB ({(got / float(sys.argv[2]) - 1) * 100:+.0f}%)")
FIT
fi
echo
cat "$tmp/json"
echo "# base: zs-estimate ${base[*]}"

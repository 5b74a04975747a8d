#!/usr/bin/env bash
# netns_scale.sh - flat, hybrid and quantized sharding side by side across 4 "nodes" x 2 ranks: network
# namespaces on a bridge (the set-up of tests/netns4.sh, from tests/netns_lib.sh), each node's link
# optionally limited by tc tbf to a slow rate. Per config: the median step time after warm-up and the
# traffic per rank per step the library counted (zs-train-mlp's "traffic:" line; n/a where it prints
# none), beside the bytes the node links really sent (the kernel's counters over the whole run, start-up
# and TCP/IP headers included, per step and rank). A config the library refuses prints the refusal. As
# root; exits 77 where namespaces cannot be made.
#
#   bash bench/netns_scale.sh [--rate RATE] [--steps N] [--warmup N] [--hidden H] [--layers L] [--build DIR]
#                             [--only NAME,...] [--reps R]
#   RATE: tc's notation (100mbit, 1gbit) or none (default 200mbit); configs: flat_s3, hybrid_mics2, hpz2, quant.
#   The configs run interleaved, rep by rep (default 3 reps); a row gives the median of the runs' median
#   steps with their [min..max], and the ratio to flat_s3's median.
set -u
here=$(cd "$(dirname "$0")" && pwd)
rate=200mbit steps=30 warmup=5 hidden=256 layers=2 build=$here/../build only='' reps=3
cmdline="bash bench/netns_scale.sh $*"
while [ $# -gt 0 ]; do
  case $1 in
  --rate) rate=$2 ;; --steps) steps=$2 ;; --warmup) warmup=$2 ;; --hidden) hidden=$2 ;;
  --layers) layers=$2 ;; --build) build=$2 ;; --only) only=$2 ;; --reps) reps=$2 ;;
  -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "netns_scale.sh: unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift 2
done
[ "$steps" -gt "$warmup" ] || { echo "netns_scale.sh: --steps must be above --warmup" >&2; exit 2; }
MLP=$build/zs-train-mlp
[ -x "$MLP" ] || { echo "netns_scale.sh: no $MLP (bash tools/build.sh build first, or --build DIR)" >&2; exit 2; }
tmp=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. "$here/../tests/netns_lib.sh"
trap 'ns_teardown; rm -rf "$tmp"' EXIT
ns_setup 4 2 || { echo "netns_scale.sh: SKIP: $ns_why"; exit 77; }
if [ "$rate" != none ]; then
  ns_qdisc tbf rate "$rate" burst 64kb latency 500ms || { echo "netns_scale.sh: tc tbf rate $rate: $ns_why" >&2; exit 1; }
fi

# NAME ZERO_KEYS: every config is stage 3, the global batch the same
configs=(
  "flat_s3|"
  "hybrid_mics2|, \"mics_shard_size\": 2"
  "hpz2|, \"zero_hpz_partition_size\": 2"
  "quant|, \"zero_quantized_weights\": true, \"zero_quantized_gradients\": true"
)

# the median of the step times after warm-up, in ms
median_ms() {
  awk -v w="$warmup" '/^step [0-9]+ / && $2 > w { for (i = 1; i < NF; i++) if ($i == "time") { t = $(i + 1); sub(/s$/, "", t); print t * 1000 } }' "$1" |
    sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) printf "%.1f", v[(NR + 1) / 2];
                     else printf "%.1f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
traffic() { # cross intra, or n/a n/a
  awk '/^traffic: cross-node/ { c = $3; i = $6 } END { if (c == "") print "n/a n/a"; else print c, i }' "$1"
}

echo "command: $cmdline"
echo "4 nodes x 2 ranks (network namespaces on a bridge), link rate per node: $rate; zs-train-mlp --hidden $hidden --layers $layers, $steps steps, median over steps after $warmup; $reps reps, interleaved"
declare -A runs refused cross intra wire layout
names=()
for c in "${configs[@]}"; do
  name=${c%%|*} keys=${c#*|}
  [ -n "$only" ] && [[ ",$only," != *",$name,"* ]] && continue
  names+=("$name")
  cat > "$tmp/$name.json" <<JSON
{"train_batch_size": 32, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0 $keys}}
JSON
done
for _ in $(seq "$reps"); do
  for name in "${names[@]}"; do
    [ -n "${refused[$name]:-}" ] && continue
    tx0=$(ns_tx_bytes)
    NS_LIMIT=600 ns_mpirun -x ZS_TIMEOUT=120 -- "$MLP" --config "$tmp/$name.json" --hidden "$hidden" --layers "$layers" \
      --seed 1 --steps "$steps" > "$tmp/$name.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
      why=$(grep -m1 'error:' "$tmp/$name.log" | sed 's/^zeroshard: error: *//')
      refused[$name]="refused or failed (rc $rc): ${why:-$(tail -n 1 "$tmp/$name.log")}"
      continue
    fi
    wire[$name]=$((($(ns_tx_bytes) - tx0) / steps / 8))
    runs[$name]="${runs[$name]:-} $(median_ms "$tmp/$name.log")"
    read -r cross[$name] intra[$name] <<< "$(traffic "$tmp/$name.log")"
    layout[$name]=$(grep -m1 -o 'shm+mpi ([0-9]* nodes' "$tmp/$name.log" | head -n 1)
  done
done
# median [min..max] of a list of numbers
stats() { tr ' ' '\n' <<< "$1" | grep . | sort -g | awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "%.1f %.1f %.1f\n", m, v[1], v[NR] }'; }
read -r flat_ms _ _ <<< "$(stats "${runs[flat_s3]:-}")" 2> /dev/null || flat_ms=
lines=()
printf '%-14s %22s %8s %16s %16s %16s  %s\n' config "step ms [min..max]" "/flat" "cross B/step/rk" "intra B/step/rk" "wire B/step/rk" note
for name in "${names[@]}"; do
  if [ -n "${refused[$name]:-}" ]; then
    printf '%-14s %22s %8s %16s %16s %16s  %s\n' "$name" - - - - - "${refused[$name]}"
    lines+=("netns_scale: config=$name rate=$rate status=refused")
    continue
  fi
  read -r ms lo hi <<< "$(stats "${runs[$name]}")"
  ratio=n/a
  [ -n "$flat_ms" ] && ratio=$(awk -v a="$ms" -v b="$flat_ms" 'BEGIN { printf "%.2f", a / b }')
  printf '%-14s %22s %8s %16s %16s %16s  %s\n' "$name" "$ms [$lo..$hi]" "$ratio" "${cross[$name]}" "${intra[$name]}" \
    "${wire[$name]}" "${layout[$name]}"
  lines+=("netns_scale: config=$name rate=$rate step_ms=$ms step_ms_min=$lo step_ms_max=$hi vs_flat=$ratio cross_bytes=${cross[$name]} intra_bytes=${intra[$name]} wire_bytes=${wire[$name]}")
done
printf '%s\n' "${lines[@]}"

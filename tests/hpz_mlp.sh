#!/usr/bin/env bash
# hpz_mlp.sh TRAIN EST - ZeRO++ hpZ (zero_optimization.zero_hpz_partition_size 2) at stage 3, 4 ranks on 2 forced
# nodes of 2, gradient accumulation 2, units re-gathered for every fetch (stage3_max_reuse_distance 0) with
# prefetch on: the flat run's params-hash in the normal and the deterministic mode (and with mics_shard_size 4 at
# 8 ranks); the memory report's parameters are the flat run's plus the secondary copy (padded / 2 elements a unit)
# and its formula the flat stage-3 formula plus psz x Psi / 2, as zs-estimate says; the traffic counter shows the
# re-gathers moved inside the node; a checkpoint resumes to the straight run's hash; with zero_quantized_weights,
# the quantized run's bits; H that does not divide the group, stage 2 and offload_param are refused naming the key
# (the last two through zs-estimate's parse, the engine's parser; test_config has them too); H equal to the group
# is accepted as off. (Loads and parameter writes in the middle of a run: hpz_reload.)
set -u
TRAIN=$1 EST=$2
. "$(dirname "$0")/lib.sh"
export ZS_FAKE_NODE_SIZE=2 ZS_TIMEOUT=${ZS_TIMEOUT:-120} # a hang fails in bounded time

det='"deterministic": "world_size_invariant", "micro_shard_size": 1'
cfg() { # cfg NAME STAGE [EXTRA_ZERO_KEYS] [ZEROSHARD_KEYS]: fp32 AdamW, clipping, every fetch a gather
  printf '{"train_batch_size": 24, "gradient_accumulation_steps": 2, "gradient_clipping": 0.05, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}, "zero_optimization": {"stage": %s,
 "reduce_bucket_size": 500, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0 %s},
 "zeroshard": {%s}}\n' "$2" "${3:-}" "${4:-}" > "$tmp/$1.json"
}
run() { # run CFG OUT [FLAGS...] [-np N] -> $tmp/OUT.out; prints the params-hash (a failed run is recorded)
  local name=$1 out=$2 h np=4
  shift 2
  if [ $# -ge 2 ] && [ "${*: -2:1}" = -np ]; then np=${*: -1}; set -- "${@:1:$#-2}"; fi
  mpirun --oversubscribe -np "$np" "$TRAIN" --config "$tmp/$name.json" "$@" > "$tmp/$out.out" 2>&1 ||
    { run_failed "$out: $(why_failed "$tmp/$out.out")"; echo "FAILED-$out"; return; }
  h=$(awk '/^params-hash/ {print $2}' "$tmp/$out.out")
  [ -n "$h" ] || { run_failed "$out printed no params-hash"; h="FAILED-$out"; }
  echo "$h"
}
same() { [ "$1" = "$2" ] && [ "${1#FAILED}" = "$1" ] && echo ok || echo bad; }
hpz=', "zero_hpz_partition_size": 2'

# bits: the gathers are copies, so nothing may differ from the flat run, in either mode. The flat run is
# zero_hpz_partition_size 4 at 4 ranks: the shard group's size, accepted as off (its start-up line says so, and its
# memory below is the flat formula's)
cfg n 3 ', "zero_hpz_partition_size": 4'; cfg nh 3 "$hpz"
fl=$(run n n --steps 4 --memory-json); hs=$(run nh nh --steps 4 --memory-json)
grep -q 'hpZ: off (zero_hpz_partition_size 4 is the shard group)' "$tmp/n.out" && r=ok || r=bad
echo "zero_hpz_partition_size 4 at 4 ranks: off: $r"; check $r "H = 4 at 4 ranks: no 'hpZ: off' start-up line"
r=$(same "$hs" "$fl")
echo "normal mode, hpZ 2 vs flat, 4 steps: $hs (flat: $fl) $r"; check $r "normal mode: hpZ $hs != flat $fl"
# (deterministic mode's train batch of 32 also splits over 8 ranks: the same bits at any world size)
cfg d 3 "" "$det"; cfg dh 3 "$hpz" "$det"; cfg dm 3 "$hpz"', "mics_shard_size": 4' "$det"
sed -i 's/"train_batch_size": 24/"train_batch_size": 32/' "$tmp/d.json" "$tmp/dh.json" "$tmp/dm.json"
fd=$(run d d --steps 4 --quiet); hd=$(run dh dh --steps 4 --quiet --save-dir "$tmp/ck" --save-every 3)
r=$(same "$hd" "$fd")
echo "deterministic mode, hpZ 2 vs flat, 4 steps: $hd (flat: $fd) $r"; check $r "deterministic: hpZ $hd != flat $fd"
# with hybrid sharding: 8 ranks, 2 shard groups of 4 (mics_shard_size 4), each with 2 secondary groups of 2
hm=$(run dm dm --steps 4 -np 8); r=$(same "$hm" "$fd")
grep -q 'hybrid: 2 groups of 4 ranks.*hpZ: secondary copy over 2 ranks' "$tmp/dm.out" || r=bad
echo "deterministic mode, mics_shard_size 4 + hpZ 2 at 8 ranks: $hm (flat at 4: $fd) $r"
check $r "mics 4 + hpZ 2 at 8 ranks: $hm != flat $fd (or no start-up line naming both)"
grep -q 'hpZ: secondary copy over 2 ranks' "$tmp/nh.out" && r=ok || r=bad
echo "start-up line names hpZ: $r"; check $r "no 'hpZ: secondary copy over 2 ranks' start-up line"

# checkpoints: saved at step 3 of the deterministic hpZ run above (the secondary is derived state, not saved);
# resumed, the run must have trained step 4 and give the straight run's hash
hr=$(run dh resumed --steps 4 --quiet --load "$tmp/ck/global_step3"); r=$(same "$hr" "$hd")
{ grep -q '^step 4 ' "$tmp/resumed.out" && ! grep -q '^step 3 ' "$tmp/resumed.out"; } || r=bad
echo "hpZ checkpoint at step 3 resumed to step 4: $hr (straight: $hd) $r"; check $r "resumed $hr != straight $hd"

# memory per rank (fp32 AdamW, N = 4): the secondary slice is padded / 2 elements against the shard's padded / 4,
# so the parameters are 3x the flat run's; the formula is the flat stage-3 one plus 4 x Psi / 2
mem() { grep -m1 '"memory": {"rank": 0' "$1" | sed 's/.*"params": \([0-9]*\), "grads": \([0-9]*\), "optimizer": \([0-9]*\), "buffers": [0-9]*, "formula": \([0-9]*\), "numel": \([0-9]*\).*/\1 \2 \3 \4 \5/'; }
read -r hp hg ho hf psi <<< "$(mem "$tmp/nh.out")"
read -r fp fg fo ff _ <<< "$(mem "$tmp/n.out")"
want=$((4 * psi / 4 + 4 * psi / 4 + 8 * psi / 4 + 4 * psi / 2))
[ -n "$psi" ] && [ "$hp" = $((3 * fp)) ] && [ "$hg $ho" = "$fg $fo" ] && [ "$hf" = "$want" ] &&
  [ "$ff" = $((want - 4 * psi / 2)) ] && r=ok || r=bad
echo "memory per rank, hpZ 2: params $hp grads $hg optimizer $ho formula $hf; flat: $fp $fg $fo formula $ff;" \
  "flat formula + 4 x Psi / 2 for Psi = $psi: $want $r"
check $r "hpZ memory: params $hp != 3 x $fp, or formula $hf != $want"
est=$("$EST" --world 4 --hpz-partition-size 2 --mlp 64,2 --config "$tmp/nh.json" --json)
e=$(echo "$est" | sed 's/.*"params": \([0-9]*\), "grads": \([0-9]*\), "optimizer": \([0-9]*\),.*"formula": \([0-9]*\).*"hpz_size": \([0-9]*\), "hpz_secondary": \([0-9]*\).*/\1 \2 \3 \4 \5 \6/')
[ "$e" = "$hp $hg $ho $hf 2 $((hp - fp))" ] && r=ok || r=bad
echo "zs-estimate --world 4 --hpz-partition-size 2: params grads optimizer formula hpz_size hpz_secondary = $e $r"
check $r "zs-estimate: '$e' != '$hp $hg $ho $hf 2 $((hp - fp))' (the hpZ run's)"

# traffic (counted by comm/, bytes/step/rank): a re-gather of a unit of p elements moved from the 4 ranks (2 of
# them across the node boundary) into the 2-rank secondary group saves 2 x p / 4 elements across and adds
# p / 2 - p / 4 inside: cross-node down by exactly twice what intra-node goes up. What is left across is one full
# gather of each unit a step, however often it is re-gathered: the same with every unit kept for the whole window.
traffic() { awk '/^traffic:/ {print $3, $6}' "$tmp/$1.out"; }
read -r fc fi <<< "$(traffic n)"; read -r hc hi <<< "$(traffic nh)"
cfg kh 3 "$hpz"; sed -i 's/"stage3_max_reuse_distance": 0/"stage3_max_reuse_distance": 1000000000/' "$tmp/kh.json"
run kh kh --steps 4 --quiet > /dev/null; read -r kc ki <<< "$(traffic kh)"
[ -n "$fc" ] && [ -n "$hc" ] && [ -n "$kc" ] && [ "$hc" -lt "$fc" ] && [ "$hi" -gt "$fi" ] &&
  [ $((fc - hc)) = $((2 * (hi - fi))) ] && [ "$kc" = "$hc" ] && [ "$ki" -lt "$hi" ] && r=ok || r=bad
echo "traffic cross/intra bytes/step/rank: flat $fc/$fi, hpZ $hc/$hi (cross -$((fc - hc)) = 2 x intra +$((hi - fi)));" \
  "hpZ with units kept: $kc/$ki $r"
check $r "traffic: flat $fc/$fi hpZ $hc/$hi kept $kc/$ki"

# with ZeRO++'s quantized weights the full gather is quantized across nodes and the secondary copy is taken from
# what it dequantized; a quantized re-gather of unchanged shards dequantizes to the same values, so qwZ + hpZ
# must give qwZ's own bits, with fewer bytes across the nodes
cfg q 3 ', "zero_quantized_weights": true'; cfg qh 3 "$hpz"', "zero_quantized_weights": true'
q=$(run q q --steps 4 --quiet); qh=$(run qh qh --steps 4 --quiet); r=$(same "$qh" "$q")
read -r qc _ <<< "$(traffic q)"; read -r qhc _ <<< "$(traffic qh)"
[ -n "$qc" ] && [ -n "$qhc" ] && [ "$qhc" -lt "$qc" ] || r=bad
echo "zero_quantized_weights + hpZ 2: $qh (quantized alone: $q), cross-node $qhc < $qc $r"
check $r "qwZ + hpZ: $qh != qwZ $q, or cross-node $qhc not below $qc"

# refusals, each naming the key; H equal to the shard group is off
refused() { # refused NAME RANKS PATTERN (what the config parser refuses: zs-estimate's parse, no MPI)
  local name=$1 np=$2 pat=$3 rc msg
  if [ "$np" = est ]; then
    "$EST" --world 4 --mlp 64,2 --config "$tmp/$name.json" > "$tmp/$name.out" 2>&1
  else
    mpirun --oversubscribe -np "$np" "$TRAIN" --config "$tmp/$name.json" --steps 1 --quiet > "$tmp/$name.out" 2>&1
  fi
  rc=$?
  msg=$(grep -m1 -- "$pat" "$tmp/$name.out")
  [ $rc -ne 0 ] && [ -n "$msg" ] && ! grep -q '^params-hash' "$tmp/$name.out" && r=ok || r=bad
  echo "$name refused: rc $rc, '$msg' $r"; check $r "$name not refused naming '$pat'"
}
cfg h3 3 ', "zero_hpz_partition_size": 3'
refused h3 4 "zero_optimization.zero_hpz_partition_size 3 does not divide the shard group's size 4"
cfg s2 2 "$hpz"
refused s2 est 'zero_optimization.zero_hpz_partition_size: 2 needs ZeRO stage 3'
cfg op 3 "$hpz"', "offload_param": {"device": "cpu"}'
refused op est 'zero_optimization.zero_hpz_partition_size: 2 is not implemented with zero_optimization.offload_param'
finish hpz_mlp

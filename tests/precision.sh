#!/usr/bin/env bash
# precision.sh TRAIN ESTIMATE - 16-bit training through the example program:
#  1. bf16 and fp16 (dynamic loss scale) train at 2 and 3 ranks: the loss falls from 1.44 at step 1 to
#     below 0.8 at step 30 (fp32 reaches 0.72 on this problem), and stages 0-3 (and offload cpu/nvme, with the
#     stage-3 parameter shards on NVMe too) give bit-identical parameters at a fixed world size;
#  2. the loss-scale trace: an overflow injected on rank 1 only skips the step on every rank, the scale
#     halves once `hysteresis` overflows have passed and doubles after loss_scale_window clean steps,
#     exactly as DeepSpeed's DynamicLossScaler (hand-computed below, and a model of its update_scale), with
#     consecutive_hysteresis on and off; a static scale never moves; an
#     overflow at the minimum scale stops the run with a clear error;
#  3. the memory report at 4 ranks, bf16 + AdamW, every stage: model states equal what zs-estimate
#     predicts for the same model, and are within 5% of 2+2+12/N, 2+14/N, 16/N bytes a parameter;
#  4. zs-estimate past 2^32 elements against the arithmetic done here.
set -u
TRAIN=$1 EST=$2
. "$(dirname "$0")/lib.sh"

# cfg NAME STAGE PRECISION_JSON [EXTRA_ZERO_KEYS] [EXTRA_TOP_KEYS]
cfg() {
  cat > "$tmp/$1.json" <<JSON
{
  "train_batch_size": 24, "gradient_clipping": 0.5, "steps_per_print": 0, $3 ${5:-}
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
  "zero_optimization": {"stage": $2, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 1 ${4:-}}
}
JSON
}
# run NAME RANKS STEPS [ARGS] -> whole output in $tmp/NAME.out, exit status in $tmp/NAME.rc; a non-zero
# status fails the test unless the caller sets may_fail=1 (a run that is meant to stop with an error).
run() {
  local name=$1 n=$2 steps=$3 rc
  shift 3
  mpirun --oversubscribe -np "$n" -x ZS_TEST_OVERFLOW "$TRAIN" --config "$tmp/$name.json" --steps "$steps" --seed 3 \
    --hidden 32 --quiet "$@" > "$tmp/$name.out" 2>&1
  rc=$?
  echo $rc > "$tmp/$name.rc"
  [ $rc -eq 0 ] || [ -n "${may_fail:-}" ] || run_failed "$name exited $rc: $(why_failed "$tmp/$name.out")"
  return $rc
}
# the params-hash of a run that exited 0, else nothing
hash_of() { [ "$(cat "$tmp/$1.rc" 2> /dev/null)" = 0 ] && awk '/^params-hash/ {print $2}' "$tmp/$1.out"; }
# ok when every named run exited 0 with a params-hash and all the hashes are equal
same_hashes() {
  local h0 h
  h0=$(hash_of "$1")
  for n in "$@"; do
    h=$(hash_of "$n")
    [ -n "$h" ] && [ "$h" = "$h0" ] || { echo bad; return; }
  done
  echo ok
}
loss_at() { awk -v s="$2" '$1 == "step" && $2 == s {print $4}' "$tmp/$1.out"; }
hashes_of() { for n in "$@"; do h=$(hash_of "$n"); printf ' %s' "${h:-FAILED($(cat "$tmp/$n.rc" 2> /dev/null))}"; done; }

# 1. bf16 and fp16: convergence and stage-for-stage bits
nv=$tmp/nvme
mkdir -p "$nv"
for prec in bf16 fp16; do
  for n in 2 3; do
    names=""
    for stage in 0 1 2 3; do
      cfg ${prec}_s$stage $stage '"'$prec'": {"enabled": true},'
      run ${prec}_s$stage $n 30
      names="$names ${prec}_s$stage"
    done
    cfg ${prec}_off3 3 '"'$prec'": {"enabled": true},' ', "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}'
    cfg ${prec}_nvme2 2 '"'$prec'": {"enabled": true},' ', "offload_optimizer": {"device": "nvme", "nvme_path": "'"$nv"'"}'
    # the 16-bit shards and their masters in the swap file, two read-ahead buffers (shards read again and again)
    cfg ${prec}_pnvme3 3 '"'$prec'": {"enabled": true},' ', "sub_group_size": 700, "offload_optimizer": {"device":
      "nvme", "nvme_path": "'"$nv"'"}, "offload_param": {"device": "nvme", "nvme_path": "'"$nv"'", "buffer_count": 2}'
    for v in off3 nvme2 pnvme3; do run ${prec}_$v $n 30; names="$names ${prec}_$v"; done
    hashes=$(hashes_of $names)
    first=$(loss_at ${prec}_s0 1) last=$(loss_at ${prec}_s0 30)
    r=$(same_hashes $names)
    echo "$prec np $n: stages 0-3, offload cpu (stage 3), nvme (stage 2) and nvme with offload_param nvme (stage 3):$hashes $r"
    check $r "$prec np $n: stages disagree:$hashes"
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b != "" && b < 0.8) }' && r=ok || r=bad
    echo "$prec np $n: loss $first (step 1) -> $last (step 30) $r"; check $r "$prec np $n: loss $first -> $last"
  done
done
# fp32 reduction of bf16 gradients (stages 2-3): the same bits at both stages
cfg c2 2 '"bf16": {"enabled": true}, "communication_data_type": "fp32",'
cfg c3 3 '"bf16": {"enabled": true}, "communication_data_type": "fp32",'
run c2 2 30; run c3 2 30
r=$(same_hashes c2 c3)
echo "bf16 reduced in fp32: stage 2, stage 3:$(hashes_of c2 c3) $r"; check $r "fp32 reduction: stages disagree"

# 2. the loss-scale trace. DynamicLossScaler with scale 2^8, window 3, hysteresis 2, overflows on rank 1 at
# boundaries 2, 3, 7: 2 uses up the hysteresis (256), 3 halves (128), 4-5 clean, 6 is the third clean
# iteration since the overflow at 3: doubles and restores the hysteresis (256), 7 uses it up (256), 8-9
# clean, 10 doubles (512).
cfg ls 2 '"fp16": {"enabled": true, "initial_scale_power": 8, "loss_scale_window": 3, "hysteresis": 2},'
ZS_TEST_OVERFLOW=1:2,3,7 run ls 2 10
got=$(awk '$1 == "step" {printf "%s%s ", $14, ($15 == "skipped" ? "*" : "")}' "$tmp/ls.out")
want="256 256* 128* 128 128 256 256* 256 256 512 "
[ "$got" = "$want" ] && r=ok || r=bad
echo "loss-scale trace (* = skipped on every rank): $got $r"; check $r "trace '$got', expected '$want': $(cat "$tmp/ls.out")"
# The traces below also go through a model of DeepSpeed's DynamicLossScaler.update_scale
# written here from its definition: an overflow halves the scale (not below min) when the hysteresis is
# used up, else uses one unit of it, and marks the iteration; a clean iteration restores the hysteresis
# (consecutive_hysteresis: at once; otherwise only when the scale grows) and doubles the scale every
# loss_scale_window iterations since the last overflow.
cat > "$tmp/scaler.py" <<'PY'
import sys
power, window, hyst, consecutive, steps = (int(a) for a in sys.argv[1:6])
overflows = {int(b) for b in sys.argv[6].split(",") if b}
scale, cur_iter, last_overflow, cur_hyst, out = 2.0 ** power, 0, -1, hyst, []
for boundary in range(1, steps + 1):
    if boundary in overflows:
        if hyst == 1 or cur_hyst == 1:
            scale = max(scale / 2, 1.0)
        else:
            cur_hyst -= 1
        last_overflow = cur_iter
    else:
        if consecutive:
            cur_hyst = hyst
        if (cur_iter - last_overflow) % window == 0:
            if not consecutive:
                cur_hyst = hyst
            scale *= 2
    cur_iter += 1
    out.append(f"{scale:g}" + ("*" if boundary in overflows else ""))
print(" ".join(out) + " ")
PY
# trace NAME POWER WINDOW HYSTERESIS CONSECUTIVE(0/1) STEPS OVERFLOWS [HAND_COMPUTED] -> ok/bad with the traces
trace() {
  local name=$1 power=$2 window=$3 hyst=$4 consec=$5 steps=$6 of=$7 hand=${8:-} got model
  cfg $name 2 '"fp16": {"enabled": true, "initial_scale_power": '$power', "loss_scale_window": '$window',
    "hysteresis": '$hyst', "consecutive_hysteresis": '$([ $consec = 1 ] && echo true || echo false)'},'
  ZS_TEST_OVERFLOW=1:$of run $name 2 $steps
  got=$(awk '$1 == "step" {printf "%s%s ", $14, ($15 == "skipped" ? "*" : "")}' "$tmp/$name.out")
  model=$(python3 "$tmp/scaler.py" $power $window $hyst $consec $steps $of)
  [ "$(cat "$tmp/$name.rc")" = 0 ] && [ "$got" = "$model" ] && { [ -z "$hand" ] || [ "$got" = "$hand" ]; } && r=ok || r=bad
  echo "loss-scale trace $name (overflows $of, hysteresis $hyst, window $window, consecutive_hysteresis $consec): $got $r"
  check $r "trace $name: '$got', DeepSpeed's update_scale gives '$model'${hand:+, by hand '$hand'}: $(tail -n 5 "$tmp/$name.out")"
}
# overflow, a clean step, an overflow inside the same hysteresis window. Without consecutive_hysteresis the
# clean step does not restore the hysteresis: the second overflow halves (128) and growth waits for 4 clean
# iterations after it (boundary 7: 256). With it, the clean step restores it: the second overflow only uses
# it (256) and boundary 7 doubles to 512.
trace hys_nc 8 4 2 0 8 1,3 "256* 256 128* 128 128 128 256 256 "
trace hys_c 8 4 2 1 8 1,3 "256* 256 256* 256 256 256 512 512 "
trace hys_long_nc 6 2 3 0 14 1,3,4,9,10,12
trace hys_long_c 6 2 3 1 14 1,3,4,9,10,12
cfg st 2 '"fp16": {"enabled": true, "loss_scale": 128},'
ZS_TEST_OVERFLOW=1:2,3 run st 2 5
got=$(awk '$1 == "step" {printf "%s%s ", $14, ($15 == "skipped" ? "*" : "")}' "$tmp/st.out")
[ "$got" = "128 128* 128* 128 128 " ] && r=ok || r=bad
echo "static loss scale: $got $r"; check $r "static scale trace '$got'"
cfg mn 2 '"fp16": {"enabled": true, "initial_scale_power": 1, "hysteresis": 1, "min_loss_scale": 1},'
may_fail=1 ZS_TEST_OVERFLOW=1:1,2,3 run mn 2 5
[ "$(cat "$tmp/mn.rc")" != 0 ] && grep -q "overflow at the minimum loss scale (fp16.min_loss_scale 1)" "$tmp/mn.out" \
  && r=ok || r=bad
echo "overflow at the minimum scale: $(grep -m1 'error:' "$tmp/mn.out") $r"; check $r "no minimum-scale error: $(cat "$tmp/mn.out")"

# 3. the memory report against the estimator and the formulas, bf16 + AdamW at 4 ranks
for stage in 0 1 2 3; do
  cfg mem$stage $stage '"bf16": {"enabled": true},'
  mpirun --oversubscribe -np 4 "$TRAIN" --config "$tmp/mem$stage.json" --steps 1 --hidden 256 --layers 3 --quiet \
    --memory-json > "$tmp/mem$stage.out" 2>&1 || run_failed "mem$stage: $(why_failed "$tmp/mem$stage.out")"
  measured=$(grep -m1 '"memory"' "$tmp/mem$stage.out")
  estimated=$("$EST" --config "$tmp/mem$stage.json" --world 4 --mlp 256,3 --json) || run_failed "zs-estimate mem$stage"
  verdict=$(python3 - "$measured" "$estimated" "$stage" <<'PY'
import json, sys
m = json.loads(sys.argv[1])["memory"]; e = json.loads(sys.argv[2])["estimate"]; stage = int(sys.argv[3])
psi, n = m["numel"], 4
want = {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}[stage]
states = m["params"] + m["grads"] + m["optimizer"]
same = all(m[k] == e[k] for k in ("params", "grads", "optimizer", "formula"))
ratio = states / want
print(f"states {states} formula {want:.0f} ratio {ratio:.4f} estimate {'equal' if same else 'DIFFERS'} "
      f"({e['params']} {e['grads']} {e['optimizer']})", "ok" if same and abs(ratio - 1) < 0.05 else "bad")
PY
)
  echo "memory bf16 stage $stage np 4: $verdict"
  [ "${verdict##* }" = ok ] && r=ok || r=bad; check $r "memory stage $stage: $verdict / $measured / $estimated"
done

# 4. the estimator past 2^32 elements: AdamW fp32 at stage 3 (zs-estimate's default config),
# against the ZeRO arithmetic done here in 64-bit shell integers: shard = ceil(units / world) rounded up to 16
# elements; parameters 4, gradients 4 and optimizer 8 bytes per shard element; formula 16 * units / world.
for case in "3 3000000001" "1 4294967311" "8 8589934609" "2 2147483649"; do
  set -- $case
  w=$1 u=$2
  sh=$(( ( (u + w - 1) / w + 15) / 16 * 16 ))
  want="numel $u params $((4 * sh)) grads $((4 * sh)) optimizer $((8 * sh)) formula $((4 * u / w * 2 + 8 * u / w))"
  out=$("$EST" --world "$w" --units "$u" --json 2>&1); rc=$?
  got=$(echo "$out" | python3 -c 'import json, sys
e = json.load(sys.stdin)["estimate"]
print(" ".join(f"{k} {e[k]}" for k in ("numel", "params", "grads", "optimizer", "formula")))' 2>&1)
  [ $rc -eq 0 ] && [ "$got" = "$want" ] && r=ok || r=bad
  echo "zs-estimate --world $w --units $u: $got $r"; check $r "zs-estimate --world $w --units $u: rc $rc, '$got', expected '$want': $out"
done

finish precision

#!/usr/bin/env bash
# gpt_device.sh MODE TRAIN DATA - zs-train-gpt's --device flag.
#   cpu:  --device cpu is the default run bit for bit; --device bogus, --device cuda with --recompute and
#         with zeroshard.deterministic are refused by name; --device cuda without a GPU (or without the CUDA
#         backend) is refused by name with no params-hash, never run on the CPU instead. Runs everywhere.
#   cuda: for a machine with a GPU (77 without one): a tiny GPT trained 20 steps with --device cuda follows
#         the CPU run at stages 0 and 3, 1 and 2 ranks (2 ranks share the one GPU: the example's GPU work
#         needs no NCCL), and at stage 3 with gradient accumulation 2: every step's loss within 1e-3
#         (relative), every step's gradient norm within 1e-2, the final validation loss within 1e-3; with
#         bf16 parameters (widened to fp32 on the GPU) every step's loss within 1e-2.
# Why a tolerance: cuBLAS sums the products in its own blocked order, the warps sum LayerNorm, softmax and
# the loss as trees, and the GPU's expf/tanhf/logf round differently from glibc's, so each fp32 result
# differs in its last bits (about 1e-7 relative). Through 20 AdamW steps such differences stay near 1e-5 of
# the loss (the PyTorch twin, with yet another summation order, holds 1e-4 in tests/gpt_parity.sh); the
# gradient norm sums squares of values that cancel more, hence 1e-2. A wrong index, mask or transpose moves
# the loss by far more than 1e-3 within a few steps.
set -u
MODE=$1 TRAIN=$2 DATA=$3
. "$(dirname "$0")/lib.sh"

# cfg NAME STAGE GAS [EXTRA_TOP_KEYS]
cfg() {
  cat > "$tmp/$1.json" <<JSON
{ "train_batch_size": 8, "gradient_accumulation_steps": $3, "gradient_clipping": 1.0, "steps_per_print": 0, ${4:-}
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}},
  "zero_optimization": {"stage": $2, "reduce_bucket_size": 5000, "stage3_param_persistence_threshold": 0} }
JSON
}
# run NAME RANKS [FLAGS...] -> the output in $tmp/NAME.out, the step metrics in $tmp/NAME.jsonl; the exit status
run() {
  local name=$1 n=$2
  shift 2
  rm -f "$tmp/$name.jsonl"
  mpirun --oversubscribe -np "$n" "$TRAIN" --config "$tmp/$name.json" --data "$DATA" --layers 2 --dim 32 --heads 2 \
    --ctx 16 --steps 20 --val-every 0 --val-batches 2 --sample 16 --seed 4 --quiet --metrics "$tmp/$name.jsonl" \
    "$@" > "$tmp/$name.out" 2>&1
}
hash_of() { awk '/^params-hash/ {print $2}' "$tmp/$1.out"; }
# KEY per step from the metrics file, one a line
series() { sed -nE "s/.*[{,] \"$2\": ([-0-9.eE+]+).*/\1/p" "$1"; }

if [ "$MODE" = cpu ]; then
  cfg c 3 1
  device_cpu_matches c 2
  # refused by name, before any training: bad value, and the combinations --device cuda does not implement
  cfg det 3 1 '"zeroshard": {"deterministic": "world_size_invariant", "micro_shard_size": 1},'
  for c in "c:--device bogus:error: --device: expected cpu or cuda" \
           "c:--device cuda --recompute:does not implement --recompute" \
           "det:--device cuda:does not implement zeroshard.deterministic"; do
    IFS=: read -r name flags want <<< "$c"
    run "$name" 1 $flags; rc=$?
    grep -q -- "$want" "$tmp/$name.out" && [ $rc -ne 0 ] && [ -z "$(hash_of "$name")" ] && r=ok || r=bad
    echo "$flags ($name): rc $rc, '$(grep -m1 error: "$tmp/$name.out")' $r"; check $r "$flags was not refused: want '$want'"
  done
  no_gpu_refused c 2 gpt_cuda
  finish gpt_device_cpu
  exit
fi

if ! gpu_visible; then
  echo "SKIP: no GPU visible (nvidia-smi -L)"; exit 77
fi
# close A B TOL: |a - b| <= TOL |a| for every line of the two lists, and as many lines (at least one)
close() {
  paste -d' ' <(echo "$1") <(echo "$2") | awk -v tol="$3" '
    NF != 2 { bad = 1 } NF == 2 { n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1;
      if (d > tol * a) bad = 1; if (a > 0 && d / a > worst) worst = d / a }
    END { printf "worst %.2g", worst; exit !(n > 0 && !bad) }'
}
for c in "0 1 1" "3 1 1" "0 2 1" "3 2 1" "3 2 2"; do
  read -r stage n gas <<< "$c"
  wl= wg= wv=
  name=s${stage}_np${n}_gas$gas
  cfg "$name" "$stage" "$gas"
  run "$name" "$n" || run_failed "$name cpu: $(why_failed "$tmp/$name.out")"
  mv "$tmp/$name.jsonl" "$tmp/$name.cpu.jsonl"
  run "$name" "$n" --device cuda || run_failed "$name cuda: $(why_failed "$tmp/$name.out")"
  lc=$(series "$tmp/$name.cpu.jsonl" loss) lg=$(series "$tmp/$name.jsonl" loss)
  gc=$(series "$tmp/$name.cpu.jsonl" grad_norm) gg=$(series "$tmp/$name.jsonl" grad_norm)
  vc=$(series "$tmp/$name.cpu.jsonl" val_loss) vg=$(series "$tmp/$name.jsonl" val_loss)
  wl=$(close "$lc" "$lg" 1e-3) && wg=$(close "$gc" "$gg" 1e-2) && wv=$(close "$vc" "$vg" 1e-3) && r=ok || r=bad
  msg="np $n stage $stage gas $gas: $(echo "$lg" | wc -l) steps, last loss cuda $(echo "$lg" | tail -1) cpu"
  msg="$msg $(echo "$lc" | tail -1) (loss $(close "$lc" "$lg" 1e-3), grad norm $(close "$gc" "$gg" 1e-2),"
  msg="$msg val $(close "$vc" "$vg" 1e-3))"
  echo "$msg $r"; check $r "cuda does not follow cpu within tolerance: $msg"
done
# bf16: the CPU multiplies bf16 x bf16 (activations rounded), the GPU widens the parameters and multiplies in
# fp32, so the runs differ by activation rounding (the CPU's bf16 and fp32 runs differ by about 2e-4 after
# 20 steps): each step's loss within 1e-2
cfg bf16 3 1 '"bf16": {"enabled": true},'
run bf16 2 || run_failed "bf16 cpu: $(why_failed "$tmp/bf16.out")"
mv "$tmp/bf16.jsonl" "$tmp/bf16.cpu.jsonl"
run bf16 2 --device cuda || run_failed "bf16 cuda: $(why_failed "$tmp/bf16.out")"
lc=$(series "$tmp/bf16.cpu.jsonl" loss) lg=$(series "$tmp/bf16.jsonl" loss)
close "$lc" "$lg" 1e-2 > /dev/null && [ -n "$(hash_of bf16)" ] && r=ok || r=bad
msg="np 2 stage 3 bf16: last loss cuda $(echo "$lg" | tail -1) cpu $(echo "$lc" | tail -1) (loss $(close "$lc" "$lg" 1e-2))"
echo "$msg $r"; check $r "bf16 cuda does not follow cpu within 1e-2: $msg"
finish gpt_cuda

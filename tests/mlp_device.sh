#!/usr/bin/env bash
# mlp_device.sh MODE TRAIN - the MLP example's --device flag.
#   cpu:  --device cpu is the default run bit for bit; bad --device / --gemm values are refused by name;
#         --device cuda without a GPU (or without the CUDA backend) is refused by name, with no params-hash,
#         never run on the CPU instead. Runs everywhere.
#   cuda: the GPU oracle, for a machine with a GPU (77 without one): --device cuda with the exact kernels
#         gives the CPU run's params-hash at stages 0-3, fp32 and bf16, accumulation 1 and 2, at 1 and 2
#         ranks (2 ranks share the one GPU: the example's GPU work needs no NCCL); --gemm cublas ends
#         within 1e-3 (relative) of the CPU run's last loss.
set -u
MODE=$1 TRAIN=$2
. "$(dirname "$0")/lib.sh"

# cfg NAME STAGE DTYPE GAS
cfg() {
  local dt=""
  [ "$3" = bf16 ] && dt='"bf16": {"enabled": true},'
  cat > "$tmp/$1.json" <<JSON
{ "train_batch_size": 24, "gradient_accumulation_steps": $4, "gradient_clipping": 0.5, "steps_per_print": 0, $dt
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
  "zero_optimization": {"stage": $2, "reduce_bucket_size": 1000, "stage3_param_persistence_threshold": 0} }
JSON
}
# run NAME RANKS [FLAGS...] -> the whole output in $tmp/NAME.out, the exit status returned
run() {
  local name=$1 n=$2
  shift 2
  mpirun --oversubscribe -np "$n" "$TRAIN" --config "$tmp/$name.json" --steps 12 --seed 5 --hidden 24 --quiet \
    "$@" > "$tmp/$name.out" 2>&1
}
hash_of() { awk '/^params-hash/ {print $2}' "$tmp/$1.out"; }
loss_of() { awk '/^step/ {l = $4} END {print l}' "$tmp/$1.out"; }

if [ "$MODE" = cpu ]; then
  cfg c 2 fp32 2
  device_cpu_matches c 2
  for bad in "--device tpu" "--gemm fast"; do
    run c 1 $bad; rc=$?
    grep -q "error: ${bad%% *}: expected" "$tmp/c.out" && [ $rc -ne 0 ] && r=ok || r=bad
    echo "$bad: rc $rc, $(grep -m1 error: "$tmp/c.out") $r"; check $r "$bad was not refused by name"
  done
  no_gpu_refused c 2 mlp_cuda
  finish mlp_device_cpu
  exit
fi

if ! gpu_visible; then
  echo "SKIP: no GPU visible (nvidia-smi -L)"; exit 77
fi
for n in 1 2; do
  for dt in fp32 bf16; do
    for gas in 1 2; do
      for stage in 0 1 2 3; do
        name=s${stage}_${dt}_g${gas}_np$n
        cfg "$name" $stage $dt $gas
        run "$name" $n || run_failed "$name cpu: $(why_failed "$tmp/$name.out")"
        hc=$(hash_of "$name")
        cp "$tmp/$name.out" "$tmp/$name.cpu"
        run "$name" $n --device cuda || run_failed "$name cuda: $(why_failed "$tmp/$name.out")"
        hg=$(hash_of "$name")
        [ -n "$hc" ] && [ "$hc" = "$hg" ] && r=ok || r=bad
        echo "np $n $dt gas $gas stage $stage: cpu $hc cuda $hg $r"; check $r "$name: cuda $hg != cpu $hc"
      done
    done
  done
  name=blas_np$n
  cfg "$name" 2 fp32 1
  run "$name" $n || run_failed "$name cpu"; lc=$(loss_of "$name")
  run "$name" $n --device cuda --gemm cublas || run_failed "$name cublas: $(why_failed "$tmp/$name.out")"
  lg=$(loss_of "$name")
  awk -v a="$lc" -v b="$lg" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= 1e-3 * (a < 0 ? -a : a)) }' \
    && r=ok || r=bad
  echo "np $n cublas last loss $lg, cpu $lc: $r"; check $r "$name: cublas loss $lg vs cpu $lc"
done
finish mlp_cuda

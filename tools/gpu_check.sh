#!/usr/bin/env bash
# gpu_check.sh [BUILD_DIR] - the GPU checks, for a machine with a GPU: builds the CUDA backend
# (ZS_CUDA=ON) and prints one summary line per check. Meant to finish within 8 minutes on one GPU; each
# step has its own timeout. Exits 1 if a check that ran failed, 77 if no GPU is visible.
set -u
cd "$(dirname "$0")/.."
dir=${1:-build-gpu}
log=$dir.gpu_check.log
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail=0
line() { printf 'gpu_check: %-34s %s\n' "$1" "$2"; }
# verdict NAME RC OUT: one summary line from a test's exit status (0 pass, 77 skip, else fail) and output
verdict() {
  case $2 in
    0) line "$1" "PASS ($(echo "$3" | grep -E 'passed' | tail -1))" ;;
    77) line "$1" "SKIP ($(echo "$3" | grep -m1 SKIP))" ;;
    *) line "$1" "FAIL rc $2 ($(echo "$3" | grep -m1 FAIL))"; fail=1 ;;
  esac
}

if ! nvidia-smi -L > /dev/null 2>&1; then
  line "gpu" "SKIP: nvidia-smi sees no GPU"
  exit 77
fi
gpus=$(nvidia-smi -L | wc -l)
line "gpu" "$gpus visible: $(nvidia-smi -L | head -1)"

t0=$(date +%s)
if ! { cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZS_CUDA=ON -DZS_WERROR=ON &&
       cmake --build "$dir" -j "$(nproc)" --target test_device test_comm_cuda test_nccl test_staged test_devpath test_devmem zs-bench zs-train-mlp; } > "$log" 2>&1; then
  line "build (ZS_CUDA=ON, -Werror)" "FAIL (see $log)"
  exit 1
fi
line "build (ZS_CUDA=ON, -Werror)" "ok in $(( $(date +%s) - t0 )) s"

# every optimizer x dtype pair x SGD form, multi-tensor launch vs the CPU scalar reference, bit for bit; and the
# kernels around it (accumulate, scale, fp32 -> bf16/fp16 conversion, zero, the norm's partials) per dtype
out=$(timeout 120 "$dir/tests/test_device" cuda 2>&1); rc=$?
echo "$out" >> "$log"
case $rc in
  0) line "CUDA kernels = CPU bits" "PASS ($(echo "$out" | tail -1))" ;;
  77) line "CUDA kernels = CPU bits" "SKIP ($(echo "$out" | tail -1))" ;;
  *) line "CUDA kernels = CPU bits" "FAIL rc $rc ($(echo "$out" | grep -m1 FAIL))"; fail=1 ;;
esac

# the collectives' kernels (the rank-order sum, fp32/bf16/fp16, and the scale) = comm/comm.c's bits, 2 ranks
out=$(timeout 120 mpirun --oversubscribe -np 2 "$dir/tests/test_comm_cuda" 2>&1); rc=$?
echo "$out" >> "$log"
verdict "comm kernels = comm.c bits np2" $rc "$out"

# the NCCL transport: ordered reduce-scatter = comm/comm.c's rank-order sum bit for bit, all-gather, all-reduce
for n in 1 2; do
  if [ "$n" -gt "$gpus" ]; then line "nccl np$n" "SKIP: $gpus GPU(s), NCCL needs one per rank"; continue; fi
  out=$(timeout 120 mpirun --oversubscribe -np $n "$dir/tests/test_nccl" 2>&1); rc=$?
  echo "$out" >> "$log"
  case $rc in
    0) line "nccl np$n" "PASS ($(echo "$out" | tail -1))" ;;
    77) line "nccl np$n" "SKIP ($(echo "$out" | grep -m1 SKIP))" ;;
    *) line "nccl np$n" "FAIL rc $rc ($(echo "$out" | grep -m1 FAIL))"; fail=1 ;;
  esac
done

# host-staged collectives on GPU buffers (2 ranks sharing the one GPU, which NCCL refuses) = comm/comm.c's bits
out=$(timeout 120 mpirun --oversubscribe -np 2 "$dir/tests/test_staged" cuda 2>&1); rc=$?
echo "$out" >> "$log"
case $rc in
  0) line "host-staged np2 on one GPU" "PASS ($(echo "$out" | tail -1))" ;;
  77) line "host-staged np2 on one GPU" "SKIP ($(echo "$out" | grep -m1 SKIP))" ;;
  *) line "host-staged np2 on one GPU" "FAIL rc $rc ($(echo "$out" | grep -m1 FAIL))"; fail=1 ;;
esac

# the fused AdamW kernel's bandwidth against cudaMemcpy D2D in the same run (goal >= 0.90)
out=$(timeout 120 "$dir/zs-bench" device --device cuda --size 256M --reps 20 2>&1); rc=$?
echo "$out" >> "$log"
m=$(echo "$out" | grep '^bench-device')
if [ $rc -eq 0 ] && [ -n "$m" ]; then
  line "AdamW vs D2D copy (goal >= 0.90)" "$m"
elif [ $rc -eq 77 ]; then
  line "AdamW vs D2D copy (goal >= 0.90)" "SKIP ($(echo "$out" | grep -m1 SKIP))"
else
  line "AdamW vs D2D copy (goal >= 0.90)" "FAIL rc $rc"; fail=1
fi

# the MLP example's layers on the GPU (exact kernels) = its CPU run's params-hash, stages 0-3, fp32/bf16,
# accumulation 1/2, at 1 and 2 ranks sharing the GPU (no NCCL involved); cuBLAS to a loss tolerance
out=$(timeout 240 bash tests/mlp_device.sh cuda "$dir/zs-train-mlp" 2>&1); rc=$?
echo "$out" >> "$log"
case $rc in
  0) line "MLP --device cuda = CPU bits" "PASS ($(echo "$out" | tail -1))" ;;
  77) line "MLP --device cuda = CPU bits" "SKIP ($(echo "$out" | grep -m1 SKIP))" ;;
  *) line "MLP --device cuda = CPU bits" "FAIL rc $rc ($(echo "$out" | grep -m1 FAIL))"; fail=1 ;;
esac

# the engine oracle on the GPU (zeroshard.device cuda: units, gradients, buckets, masters and moments in GPU
# memory): stages 0-3 x offload_optimizer none/cpu/nvme x fp32/bf16/fp16 give the CPU device's params-hash and
# gradient norms at the same world size, checkpoints crossed between the two; one rank per GPU takes NCCL's
# ordered mode (np1 here), 2-4 ranks sharing the one GPU the host-staged collectives
for n in 1 2 3 4; do
  out=$(timeout 150 mpirun --oversubscribe -np $n "$dir/tests/test_devpath" cuda 2>&1); rc=$?
  echo "$out" >> "$log"
  verdict "engine oracle on the GPU np$n" $rc "$out"
done

# device memory (zeroshard.device cuda, stage 3, both offloads cpu): the engine's buffers come from the device
# arena, a third stage-3 unit held beyond the gathered region is refused by name, the host pool is pinned by
# cudaHostRegister (a second registration of it is refused), and where hwloc placed the rank near the GPU
out=$(timeout 60 mpirun --oversubscribe -np 1 "$dir/tests/test_devmem" cuda 2>&1); rc=$?
echo "$out" >> "$log"
verdict "device arena, pinned host pool" $rc "$out"
p=$(echo "$out" | grep -m1 '^placement:')
[ -n "$p" ] && line "placement near the GPU" "${p#placement: }"

# NCCL's own reduce-scatter in the engine (zeroshard.device_comm "nccl", here through ZS_DEVICE_COMM): at np1
# only, since NCCL needs one GPU per rank; with one rank its sum is a copy (16-bit widened, scaled, rounded once),
# so the oracle's bits must hold. At 2+ ranks the mode is not bit-identical; test_nccl checks it to a tolerance.
out=$(ZS_DEVICE_COMM=nccl timeout 150 mpirun --oversubscribe -np 1 -x ZS_DEVICE_COMM "$dir/tests/test_devpath" cuda 2>&1); rc=$?
echo "$out" >> "$log"
verdict "engine, device_comm nccl, np1" $rc "$out"

# ZeRO-Offload from the GPU (stage 2, offload_optimizer cpu): gradients down, the CPU's AdamW, parameters up,
# against the pinned D2H + H2D copy of the same bytes measured in the same run (ratio copy/optimizer: 1.0 would
# be the PCIe bound)
for dt in fp32 bf16; do
  out=$(timeout 150 "$dir/zs-bench" offload --device cuda --size 64M --reps 10 --dtype $dt 2>&1); rc=$?
  echo "$out" >> "$log"
  m=$(echo "$out" | grep '^bench-offload')
  if [ $rc -eq 0 ] && [ -n "$m" ]; then
    line "offload step GPU->CPU->GPU $dt" "$m"
  else
    line "offload step GPU->CPU->GPU $dt" "FAIL rc $rc ($(echo "$out" | tail -1))"; fail=1
  fi
done

# The GPT example on the GPU (built here: the build above makes only its own targets). First it follows its
# CPU run to the tolerances tests/gpt_device.sh states (stages 0/3, 1-2 ranks sharing the GPU, bf16), then
# tokens/s of bench/gpt_bench.py's model (6 layers, width 384, 6 heads, context 256; fp32, stage 0, one rank):
# the benchmark's batch of 8 sequences on the GPU and on this machine's CPU, and 32 sequences on the GPU.
gpt_bench() { # gpt_bench NAME MICRO DEVICE -> prints "TOKS_PER_S COMMAND" (median over steps 2-8), or fails
  local cfg=$dir/gpt_$1.json cmd
  printf '{"train_micro_batch_size_per_gpu": %s, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, %s}\n' \
    "$2" '"steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}}, "zero_optimization": {"stage": 0}' > "$cfg"
  cmd="$dir/zs-train-gpt --config $cfg --data tests/data/parity.txt --layers 6 --dim 384 --heads 6 --ctx 256 --steps 8"
  cmd="$cmd --val-every 0 --val-batches 1 --sample 0 --quiet --metrics $dir/gpt_$1.jsonl --device $3"
  rm -f "$dir/gpt_$1.jsonl"
  timeout 90 mpirun --oversubscribe -np 1 $cmd >> "$log" 2>&1 || return 1
  sed -nE 's/.*"tokens_per_s": ([0-9.]+).*/\1/p' "$dir/gpt_$1.jsonl" | tail -n +2 | sort -g |
    awk -v c="mpirun -np 1 $cmd" '{ v[NR] = $1 } END { if (NR < 1) exit 1; printf "%.0f %s\n", v[int((NR + 1) / 2)], c }'
}
if timeout 150 cmake --build "$dir" -j "$(nproc)" --target zs-train-gpt >> "$log" 2>&1; then
  out=$(timeout 120 bash tests/gpt_device.sh cuda "$dir/zs-train-gpt" tests/data/parity.txt 2>&1); rc=$?
  echo "$out" >> "$log"
  case $rc in
    0) line "GPT --device cuda follows its CPU run" "PASS ($(echo "$out" | tail -1))" ;;
    77) line "GPT --device cuda follows its CPU run" "SKIP ($(echo "$out" | grep -m1 SKIP))" ;;
    *) line "GPT --device cuda follows its CPU run" "FAIL rc $rc ($(echo "$out" | grep -m1 FAIL))"; fail=1 ;;
  esac
  for b in "gpu8 8 cuda" "cpu8 8 cpu" "gpu32 32 cuda"; do
    read -r name micro device <<< "$b"
    if r=$(gpt_bench "$name" "$micro" "$device"); then
      line "GPT tokens/s $device, batch $micro" "${r%% *} tok/s: ${r#* }"
    else
      line "GPT tokens/s $device, batch $micro" "FAIL (see $log)"; fail=1
    fi
  done
else
  line "GPT --device cuda follows its CPU run" "FAIL (build of zs-train-gpt, see $log)"; fail=1
fi
line "total" "$(( $(date +%s) - t0 )) s, log in $log"
exit $fail

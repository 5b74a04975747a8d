#!/usr/bin/env bash
# gpu_check.sh BUNDLE - every check of the CUDA backend, run from a bundle made by tools/gpu_bundle.sh (nothing
# is built here), in one call under one deadline (8 minutes; ZS_GPU_CHECK_DEADLINE=S sets another): each step
# runs under min(its own cap, the time left), and one that cannot start in time is SKIP (deadline). One line
# per check, PASS / FAIL / SKIP (why), then a summary; the whole log in ${OUT:-.}/gpu_check.log. Once
# nvidia-smi lists a GPU a SKIP counts as a FAIL (a CUDA runtime that cannot start must not look like a pass),
# except an optional check's own SKIP (DeepSpeed, which the check compares against, unavailable). The C stages
# come first, then the PyTorch stage (tools/gpu_check_torch.py); ZS_GPU_CHECK_ONLY=PREFIX runs only the checks
# whose names start with PREFIX (and the bundle's two), e.g. "torch" for the PyTorch stage alone.
# Exits 0 when every check passed (optional ones skipped aside), 77 when no GPU is visible (every GPU line SKIP)
# and the rest passed, else 1.
set -u
t0=$(date +%s)
end=$((t0 + ${ZS_GPU_CHECK_DEADLINE:-480}))
MIN_START=5 # seconds: a step with less left than this is not started
[ $# -eq 1 ] && [ -f "$1/env.sh" ] || { echo "usage: gpu_check.sh BUNDLE (a folder made by tools/gpu_bundle.sh)" >&2; exit 2; }
bundle=$(cd "$1" && pwd)
mkdir -p "${OUT:-.}"
log=$(cd "${OUT:-.}" && pwd)/gpu_check.log
: > "$log"
cd "$(dirname "$0")/.." || exit 2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch" "${ZS_BUNDLE_RUN:-}"' EXIT
. "$bundle/env.sh" 2>> "$log"
# mpirun as root (the lent machine's user); no core binding: the runtime places its own threads near the GPU
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_hwloc_base_binding_policy=none
export ZS_TEST_NVME_DIR=$scratch TMPDIR=$scratch
MPIRUN="mpirun --oversubscribe -np"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
npass=0 nfail=0 nskip=0 nopt=0

{ echo "gpu_check: $(date -u '+%F %T') UTC, bundle $bundle, deadline $((end - t0)) s"; cat "$bundle/MANIFEST"
  nvidia-smi 2>&1 | head -20; echo "PATH=$PATH"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; } >> "$log"

# verdict NAME pass|fail|skip|optskip WHY: the check's line, on the terminal and in the log
verdict() {
  local r=$2 why=$3
  [ "$r" = skip ] && [ "$gpus" -gt 0 ] && r=fail why="skipped with a GPU visible: $why"
  case $r in
    pass) npass=$((npass + 1)) ;;
    fail) nfail=$((nfail + 1)) ;;
    skip) nskip=$((nskip + 1)) ;;
    optskip) nskip=$((nskip + 1)) nopt=$((nopt + 1)) r=skip ;;
  esac
  printf 'gpu_check: %-38s %s (%s)\n' "$1" "$(echo "$r" | tr a-z A-Z)" "$why" | tee -a "$log"
}

# step NAME CAP gpu|gpu-opt|cpu SHOW CMD...: CMD under min(CAP, time left), told when that is (ZS_STEP_END, a
# Unix time); on success the line quotes the last line of its output matching the regex SHOW (any line where SHOW
# is empty). gpu-opt: a GPU check whose own SKIP (exit 77) stays a SKIP with a GPU visible.
step() {
  local name=$1 cap=$2 kind=$3 show=$4 left t rc s0 out=$scratch/step.out
  shift 4
  if [ -n "${ZS_GPU_CHECK_ONLY:-}" ] && [ "$kind" != cpu ] && [ "${name#"$ZS_GPU_CHECK_ONLY"}" = "$name" ]; then return; fi
  if [ "$kind" != cpu ] && [ "$gpus" -eq 0 ]; then verdict "$name" skip "no GPU: nvidia-smi lists none"; return; fi
  left=$((end - $(date +%s)))
  if [ $left -lt $MIN_START ]; then verdict "$name" skip "deadline: $((left > 0 ? left : 0)) s left"; return; fi
  t=$((cap < left ? cap : left))
  echo "=== $name: $* (limit $t s)" >> "$log"
  s0=$(date +%s)
  ZS_STEP_END=$((s0 + t)) timeout -k 5 "$t" "$@" > "$out" 2>&1
  rc=$?
  tail -c 300000 "$out" >> "$log"
  echo "=== $name: rc $rc in $(($(date +%s) - s0)) s" >> "$log"
  case $rc in
    0) verdict "$name" pass "$(grep -E "${show:-.}" "$out" | tail -1) in $(($(date +%s) - s0)) s" ;;
    77) verdict "$name" "$([ "$kind" = gpu-opt ] && echo optskip || echo skip)" "$(grep -m1 SKIP "$out" || tail -1 "$out")" ;;
    124|137) verdict "$name" fail "timed out after $t s" ;;
    *) verdict "$name" fail "rc $rc: $(grep -m1 -E 'FAIL|error' "$out" || tail -1 "$out")" ;;
  esac
}

# bundle_loads: every program and library of the bundle finds the libraries it needs here
bundle_loads() {
  local f miss
  miss=$(for f in "$ZS_BUNDLE_RUN"/bin/* "$bundle"/bin/* "$ZS_BUNDLE_RUN"/lib/*.so* "$bundle"/lib/*.so*; do
    [ -f "$f" ] && [ "${f%.gz}" = "$f" ] && ldd "$f" 2>&1 | grep -E 'not found|error' | sed "s|^|${f##*/}: |"
  done | sort -u)
  # and what the image must provide, NCCL too (loaded at run time, so ldd does not list it)
  for f in $(cat "$bundle/needs"); do
    for d in ${LD_LIBRARY_PATH//:/ } ""; do [ -e "$d/$f" ] && break; done
    [ -n "$d" ] || ldconfig -p | grep -q " $f " || miss="$miss $f: not found"
  done
  [ -z "$miss" ] || { echo "FAIL: $miss"; return 1; }
  echo "all libraries found: $(ls "$bundle/bin" | wc -l) programs, glibc $(ldd --version | head -1 | awk '{print $NF}')"
}

# gpt_tokens MICRO DEVICE: tokens/s of bench/gpt_bench.py's model (6 layers, width 384, 6 heads, context 256;
# fp32, stage 0, one rank), the median over steps 2-8 (step 1 warms up)
gpt_tokens() {
  local cfg=$scratch/gpt_$1_$2.json m=$scratch/gpt_$1_$2.jsonl
  printf '{"train_micro_batch_size_per_gpu": %s, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0, %s}\n' \
    "$1" '"steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}}, "zero_optimization": {"stage": 0}' > "$cfg"
  $MPIRUN 1 zs-train-gpt --config "$cfg" --data tests/data/parity.txt --layers 6 --dim 384 --heads 6 --ctx 256 \
    --steps 8 --val-every 0 --val-batches 1 --sample 0 --quiet --metrics "$m" --device "$2" || return 1
  sed -nE 's/.*"tokens_per_s": ([0-9.]+).*/\1/p' "$m" | tail -n +2 | sort -g |
    awk -v b="$1" '{ v[NR] = $1 } END { if (NR < 1) exit 1; printf "tokens/s %.0f (batch %d, median of %d steps)\n", v[int((NR + 1) / 2)], b, NR }'
}
# torch_check ARGS...: tools/gpu_check_torch.py on the GPU, its runs' files under the scratch folder
torch_check() {
  python3 tools/gpu_check_torch.py "$@" --device cuda --scratch "$scratch/torch" --ds-wheels "$bundle/py"
}
export -f bundle_loads gpt_tokens torch_check
export bundle scratch MPIRUN
# the PyTorch stage: the package from the tree, the library from the bundle (unpacked if it was stored gzipped)
ZEROSHARD_LIB=$bundle/lib/libzeroshard.so
[ -f "$ZS_BUNDLE_RUN/lib/libzeroshard.so" ] && ZEROSHARD_LIB=$ZS_BUNDLE_RUN/lib/libzeroshard.so
export ZEROSHARD_LIB PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1
echo "ZEROSHARD_LIB=$ZEROSHARD_LIB PYTHONPATH=$PYTHONPATH" >> "$log"

# The caps (seconds) are backstops for an H200: a test that passes takes seconds (CUDA and NCCL start-up included),
# the MLP check's 68 short runs about a minute, a benchmark well under one; a hang costs only its cap.
# Before the GPU: the bundle itself (a failure here explains every later one)
step "bundle's libraries load" 30 cpu '' bash -c bundle_loads
step "bundle's mpirun, 2 ranks on the CPU" 60 cpu params-hash \
  $MPIRUN 2 zs-train-mlp --config examples/configs/zero3.json --steps 4 --quiet
# Kernels bit for bit: every optimizer x dtype pair, the multi-tensor launch against the CPU scalar reference, and
# accumulate, scale, conversions, zero-fill and the norm's partials per dtype
step "CUDA kernels = CPU bits" 30 gpu passed test_device cuda
# The engine oracle (model states in GPU memory; stages 0-3 x offload none/cpu/nvme x fp32/bf16/fp16 give the CPU
# device's params-hash), at one rank through NCCL's ordered mode (named, so that a NCCL that cannot start fails
# zs_init rather than leaving the staged transport to run instead), the wheel's libnccl
step "engine oracle np1 (NCCL ordered)" 60 gpu passed env ZS_DEVICE_COMM=ordered $MPIRUN 1 -x ZS_DEVICE_COMM test_devpath cuda
step "NCCL transport np1" 30 gpu passed $MPIRUN 1 test_nccl
# NCCL's own reduce-scatter in the engine: with one rank its sum is a copy, so the oracle's bits hold
step "engine oracle np1, device_comm nccl" 60 gpu passed env ZS_DEVICE_COMM=nccl $MPIRUN 1 -x ZS_DEVICE_COMM test_devpath cuda
# The device arena, the pinned host pool (a refused pin tolerated) and the placement near the GPU
step "device arena, pinned host pool" 30 gpu passed $MPIRUN 1 test_devmem cuda
# The arena's zero-fill read back through copies: a block dirtied, given back and handed out again reads as zeros
step "device arena zero-fill, read back" 30 gpu passed test_devmem fill
# 2-4 ranks sharing the one GPU (NCCL refuses that): the host-staged transport, bit for bit
step "comm kernels np2 = comm.c bits" 30 gpu passed $MPIRUN 2 test_comm_cuda
step "host-staged collectives np2" 45 gpu passed $MPIRUN 2 test_staged cuda
for n in 2 3 4; do
  step "engine oracle np$n (host-staged)" $((30 + 15 * n)) gpu passed env ZS_DEVICE_COMM=staged $MPIRUN $n -x ZS_DEVICE_COMM test_devpath cuda
done
# Past one node on the GPU: hybrid sharding (shard groups of 2) and the quantized collectives (host-staged, the CPU's
# quantization) at 4 ranks in two forced nodes of 2, against the CPU device's params-hash
step "engine oracle np4, hybrid and quantized" 90 gpu passed env ZS_FAKE_NODE_SIZE=2 $MPIRUN 4 -x ZS_FAKE_NODE_SIZE test_devpath cuda scale
# The examples on the GPU against their CPU runs: the MLP bit for bit, the GPT to stated tolerances
step "MLP --device cuda = CPU bits" 150 gpu passed bash tests/mlp_device.sh cuda zs-train-mlp
step "GPT --device cuda follows its CPU run" 90 gpu passed bash tests/gpt_device.sh cuda zs-train-gpt tests/data/parity.txt
# Benchmarks: the fused AdamW step against a device-to-device copy of the same bytes in the same run (goal 0.90
# of the copy), the ZeRO-Offload step against the pinned PCIe copy of the same bytes, the GPT example's tokens/s
step "bench AdamW vs D2D copy (goal 0.90)" 60 gpu '^bench-device' zs-bench device --device cuda --size 256M --reps 20
for dt in fp32 bf16; do
  step "bench offload step $dt vs PCIe copy" 60 gpu '^bench-offload' zs-bench offload --device cuda --size 64M --reps 10 --dtype $dt
done
step "bench GPT tokens/s, GPU, batch 8" 60 gpu tokens/s bash -c 'gpt_tokens 8 cuda'
step "bench GPT tokens/s, CPU, batch 8" 60 gpu tokens/s bash -c 'gpt_tokens 8 cpu'
step "bench GPT tokens/s, GPU, batch 32" 60 gpu tokens/s bash -c 'gpt_tokens 32 cuda'

# The PyTorch stage: python/zeroshard from the tree over the bundle's libzeroshard, a GPT-2-shaped Hugging Face model
# in bf16 on the GPU (tools/gpu_check_torch.py; each line quotes its digest): the loss against plain PyTorch's and
# stage 0 = stage 3 bits at 1 rank and at 2 sharing the GPU; tokens/s and peak memory against PyTorch and DeepSpeed
# (its wheels from the bundle's py/); the largest model ZeRO-Offload trains, ZeroShard's and DeepSpeed's
step "torch GPT-2 bf16 vs PyTorch, 1 rank" 90 gpu 'result:' bash -c 'torch_check parity --ranks 1'
step "torch GPT-2 bf16 vs PyTorch, 2 ranks" 120 gpu 'result:' bash -c 'torch_check parity --ranks 2'
step "torch tokens/s, memory vs PyTorch" 150 gpu 'result:' bash -c 'torch_check perf'
step "torch ZeRO-Offload, largest model" 120 gpu 'result:' bash -c 'torch_check offload --backend zeroshard'
step "torch ZeRO-Offload, DeepSpeed" 150 gpu-opt 'result:' bash -c 'torch_check offload --backend deepspeed'

printf 'gpu_check: summary: %d passed, %d failed, %d skipped (%d optional) in %d s (deadline %d s, %d GPU(s)); log %s\n' \
  $npass $nfail $nskip $nopt $(($(date +%s) - t0)) $((end - t0)) "$gpus" "$log" | tee -a "$log"
[ $nfail -eq 0 ] || exit 1
[ "$gpus" -gt 0 ] || exit 77
[ $((nskip - nopt)) -eq 0 ] || exit 1
exit 0

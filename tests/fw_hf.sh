#!/usr/bin/env bash
# fw_hf.sh MODE LIBDIR - the Hugging Face Trainer's own DeepSpeed integration on ZeroShard: examples/pytorch/
# fortunes_hf.py's zeroshard_* strategies (TrainingArguments(deepspeed=config)) under `zeroshard-run -np 2`, the
# plain Trainer under mpirun; tests/fw_hf.py MODE DIR checks what they wrote. The package from python/,
# libzeroshard from LIBDIR (the build tree). Skips (77) when python3 lacks transformers or accelerate.
#   parity  the plain Trainer and stages 1 and 3 over an epoch end a short accumulation window closes
#   ckpt    stage 3: resume from checkpoint-10 bit for bit; the save_model folder
#   config  a config contradicting TrainingArguments raises as transformers does; gradient_clipping absent
#           from the config is not filled with max_grad_norm
#   cuda    stage 3 with `zeroshard.device: "cuda"` in the same config, over LIBDIR/tests/libzeroshard_cudaemu.so
#           (the CUDA backend on the emulator): bit for bit the CPU device's run
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
py_test_env fw_hf "torch, transformers, accelerate" "$LIBDIR"
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore   # Accelerate picks (and warns) otherwise; the ranks share a small machine
ex=$here/../examples/pytorch/fortunes_hf.py
# 29 micro-batches of 32 an epoch per rank at accumulation 2: step 15 is a window of one, the 20 steps cross it
TINY="--dim 64 --layers 1 --heads 4 --seq 48 --micro-batch 32 --accum 2 --lr 5e-3 --warmup 3 --clip 1.0 --steps 20"
zs() { # name strategy flags...: the example under zeroshard-run, its RESULT in $tmp/name.json
  local name=$1 s=$2
  shift 2
  python3 -m zeroshard.run -np 2 "$ex" --strategy "$s" $TINY "$@" --result "$tmp/$name.json" > "$tmp/$name.log" 2>&1 ||
    { run_failed "$name"; grep -v '^\[rank.\]:  ' "$tmp/$name.log" | tail -15; }
}
plain() { # name flags...: the plain Trainer (DDP over gloo) under mpirun
  local name=$1
  shift
  mpirun --oversubscribe -np 2 python3 "$ex" --strategy trainer $TINY "$@" --result "$tmp/$name.json" \
    > "$tmp/$name.log" 2>&1 || { run_failed "$name"; tail -15 "$tmp/$name.log"; }
}
verdict() { python3 "$here/fw_hf.py" "$MODE" "$tmp" && check ok "$MODE" || check no "$MODE"; }
case $MODE in
  parity)
    plain trainer
    zs stage1 zeroshard_stage_1
    zs stage3 zeroshard_stage_3
    verdict ;;
  ckpt)
    save="--save-dir $tmp/run --save-at 10 --no-eval"
    zs full zeroshard_stage_3 $save
    zs resumed zeroshard_stage_3 $save --resume
    verdict ;;
  config)
    # transformers compares a config value that is not "auto" with TrainingArguments and raises
    printf '{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 8, "gradient_clipping": "auto"}' > "$tmp/micro8.json"
    python3 -m zeroshard.run -np 2 "$ex" --strategy zeroshard_stage_2 $TINY --micro-batch 4 --deepspeed "$tmp/micro8.json" \
      > "$tmp/micro8.log" 2>&1
    rc=$?
    msg=$(grep -m1 'ds train_micro_batch_size_per_gpu=8 vs hf per_device_train_batch_size=4' "$tmp/micro8.log")
    echo "fw_hf config: micro-batch 8 in the config, 4 in TrainingArguments: exit $rc, ${msg:-no message}"
    [ $rc -ne 0 ] && [ -n "$msg" ] && check ok micro8 || { check no "micro8"; tail -5 "$tmp/micro8.log"; }
    # no gradient_clipping key: DeepSpeed 0.19.8's default, clipping at 1.0, whatever max_grad_norm says (0 here)
    printf '{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}' > "$tmp/noclip.json"
    zs absent zeroshard_stage_2 --no-eval --clip 0 --deepspeed "$tmp/noclip.json"
    zs clip0 zeroshard_stage_2 --no-eval --clip 0
    zs clip1 zeroshard_stage_2 --no-eval
    verdict ;;
  cuda)
    for dev in cpu cuda; do
      python3 - "$ex" "$dev" > "$tmp/$dev.json" <<'PY'
import json, os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import fortunes_hf
c = fortunes_hf.zero_config("zeroshard_stage_3")
c["zeroshard"] = {"device": sys.argv[2]}
print(json.dumps(c))
PY
    done
    zs cpu3 zeroshard_stage_3 --no-eval --deepspeed "$tmp/cpu.json"
    ZEROSHARD_LIB=$LIBDIR/tests/libzeroshard_cudaemu.so zs cuda3 zeroshard_stage_3 --no-eval --deepspeed "$tmp/cuda.json"
    verdict ;;
  *) echo "fw_hf.sh: unknown mode $MODE"; exit 2 ;;
esac
finish "fw_hf $MODE"

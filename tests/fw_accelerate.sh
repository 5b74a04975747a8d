#!/usr/bin/env bash
# fw_accelerate.sh MODE LIBDIR - Accelerate's own DeepSpeed path on ZeroShard: examples/pytorch/
# fortunes_accelerate.py's zeroshard_* strategies (Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=...)))
# under `zeroshard-run -np 2`, plain Accelerate under mpirun; tests/fw_accelerate.py MODE DIR checks what they
# wrote. The package from python/, libzeroshard from LIBDIR. Skips (77) without torch, transformers, accelerate.
#   parity  plain Accelerate and stages 1 and 3, accumulation 2, clipping at 1.0
#   clip    `--use_deepspeed --deepspeed_config_file` with "gradient_clipping": "auto" clips at 1.0
#   gather  gather_for_metrics over a drop_last loader: the samples plain Accelerate counts
#   resume  save_state at stage 3, load_state in a fresh job: the same losses and params-hash
#   cuda    stage 3 on zeroshard.device "cuda" over LIBDIR/tests/libzeroshard_cudaemu.so: the cpu device's bits
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
py_test_env fw_accelerate "torch, transformers, accelerate" "$LIBDIR"
export OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
ex=$here/../examples/pytorch/fortunes_accelerate.py
TINY="--steps 20 --dim 32 --layers 1 --heads 2 --seq 64 --micro-batch 8 --accum 2 --lr 1.5e-2 --warmup 2 --clip 1.0"
zs() { # name "zeroshard-run flags" script flags...: under zeroshard-run, RESULT in $tmp/name.json
  local name=$1 pre=$2
  shift 2
  python3 -m zeroshard.run -np 2 $pre "$@" --result "$tmp/$name.json" > "$tmp/$name.log" 2>&1 ||
    { run_failed "$name"; grep -v '^\[rank.\]:  ' "$tmp/$name.log" | tail -15; }
}
plain() { # name script flags...: under mpirun (DDP over gloo)
  local name=$1
  shift
  mpirun --oversubscribe -np 2 python3 "$@" --result "$tmp/$name.json" > "$tmp/$name.log" 2>&1 ||
    { run_failed "$name"; grep -v '^\[rank.\]:  ' "$tmp/$name.log" | tail -15; }
}
verdict() { python3 "$here/fw_accelerate.py" "$MODE" "$tmp" && check ok "$MODE" || check no "$MODE"; }
case $MODE in
  parity)
    plain accelerate "$ex" --strategy accelerate $TINY
    zs stage1 "" "$ex" --strategy zeroshard_stage_1 $TINY
    zs stage3 "" "$ex" --strategy zeroshard_stage_3 $TINY
    verdict ;;
  clip)
    # at this learning rate the gradient norm passes 1.0: clipping at 1.0 bites (the check holds it)
    TINY="--steps 12 --dim 64 --layers 1 --heads 4 --seq 48 --micro-batch 32 --accum 2 --lr 5e-2 --warmup 1 --clip 1.0"
    printf '{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "zero_force_ds_cpu_optimizer": false}' > "$tmp/auto.json"
    zs auto "--use_deepspeed --deepspeed_config_file $tmp/auto.json" "$ex" --strategy zeroshard_stage_2 $TINY --no-eval
    zs clip1 "" "$ex" --strategy zeroshard_stage_2 $TINY --no-eval
    zs clip0 "" "$ex" --strategy zeroshard_stage_2 $TINY --no-eval --clip 0
    verdict ;;
  gather)
    plain plain "$here/fw_accelerate.py" gather-run
    zs ds "--use_deepspeed --deepspeed_config_file $here/ds_scripts/ds_accel.json" "$here/fw_accelerate.py" gather-run
    verdict ;;
  resume)
    # 12 steps at stage 3, accumulation 4, saved after step 8; a fresh job loads that and runs steps 9-12
    run="$ex --strategy zeroshard_stage_3 $TINY --steps 12 --accum 4 --no-eval --save-dir $tmp/ck"
    zs full "" $run --save-at 8
    zs resumed "" $run --save-at 8 --resume
    verdict ;;
  cuda)
    # `--use_deepspeed --deepspeed_config_file` at stage 3 with zeroshard.device "cuda", over the library built on
    # the CUDA emulator (an emulated GPU): bit for bit the same file with "cpu"
    for dev in cpu cuda; do
      printf '{"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": 1.0, "zero_force_ds_cpu_optimizer": false, "zeroshard": {"device": "%s"}}' $dev > "$tmp/$dev.json"
    done
    zs cpu3 "--use_deepspeed --deepspeed_config_file $tmp/cpu.json" "$ex" --strategy zeroshard_stage_3 $TINY --no-eval
    ZEROSHARD_LIB=$LIBDIR/tests/libzeroshard_cudaemu.so \
      zs cuda3 "--use_deepspeed --deepspeed_config_file $tmp/cuda.json" "$ex" --strategy zeroshard_stage_3 $TINY --no-eval
    verdict ;;
  *) echo "fw_accelerate.sh: unknown mode $MODE"; exit 2 ;;
esac
finish "fw_accelerate $MODE"

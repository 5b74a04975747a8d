#!/usr/bin/env bash
# fw_accelerate.sh MODE LIBDIR - zeroshard.accelerate against Accelerate (tests/fw_accelerate.py MODE), with the
# package from python/ and libzeroshard from LIBDIR (the build tree). Exits 77 (skip) when torch, transformers or
# accelerate cannot be imported: tools/setup_tests.sh installs them.
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
py_test_env fw_accelerate "torch, transformers, accelerate" "$LIBDIR"
run="mpirun --oversubscribe -np 2"
py="python3 $here/fw_accelerate.py"
case $MODE in
  parity) $run $py parity ;;
  resume)
    # 20 steps at stage 3, accumulation 4, saved after step 16 (in the second pass over the data, 57 micro-batches
    # a pass); a fresh job loads that and runs steps 17-20
    ex="python3 $here/../examples/pytorch/fortunes_accelerate.py --strategy zeroshard_stage_3 --steps 20 --dim 32
        --layers 1 --heads 2 --seq 64 --micro-batch 16 --accum 4 --lr 1.5e-2 --warmup 2 --clip 0.1 --no-eval
        --save-dir $tmp/ck"
    $run $ex --save-at 16 --result "$tmp/full.json" > /dev/null &&
      $run $ex --resume --result "$tmp/resumed.json" > /dev/null && $py resume "$tmp" ;;
  misuse) $py misuse ;;   # no mpirun: a world of one
  *) echo "fw_accelerate.sh: unknown mode $MODE"; exit 2 ;;
esac

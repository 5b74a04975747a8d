#!/usr/bin/env bash
# fw_lightning.sh MODE LIBDIR - the Lightning Trainer on ZeroShard (tests/fw_lightning.py MODE) under mpirun, with
# the package from python/ and libzeroshard from LIBDIR (the build tree). Exits 77 (skip) when torch,
# transformers or lightning cannot be imported: tools/setup_tests.sh installs them.
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
py_test_env fw_lightning "torch, transformers, lightning" "$LIBDIR"
export PYTHONWARNINGS=ignore   # Lightning's tips and deprecation notes would bury the verdict
run="mpirun --oversubscribe -np 2"
py="python3 $here/fw_lightning.py"
case $MODE in
  parity) $run $py parity ;;
  resume)
    # saved at steps 10 and 20 by one run; the step-20 checkpoint removed, a fresh run resumes step 10's
    $run $py save "$tmp" && rm -rf "$tmp/step20.ckpt" && $run $py resume "$tmp" ;;
  cuda)   # the library over the CUDA emulator, whose zeroshard.device "cuda" is an emulated GPU
    ZEROSHARD_LIB=$LIBDIR/tests/libzeroshard_cudaemu.so $run -x ZEROSHARD_LIB $py cuda ;;
  surface)   # no mpirun: a world of one
    $py surface "$tmp" ;;
  *) echo "fw_lightning.sh: unknown mode $MODE"; exit 2 ;;
esac

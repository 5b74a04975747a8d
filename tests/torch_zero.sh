#!/usr/bin/env bash
# torch_zero.sh MODE LIBDIR - zeroshard.zero (Init, GatheredParameters) and zeroshard.utils checks
# (tests/torch_zero.py MODE), and the memory report's (MODE report: tests/torch_memory.py) under mpirun, with the package from python/ and libzeroshard from LIBDIR (the
# build tree). torch_zero.py exits 77 (skip), saying so, when torch cannot be imported.
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
case $MODE in
  memory) np=4 ;;
  parity|gather|utils|report) np=2 ;;
  *) echo "torch_zero.sh: unknown mode $MODE"; exit 2 ;;
esac
# zero.Init's spill files go to lib.sh's scratch dir (on the disk under test, not in memory)
# TORCH_API_LIB / TORCH_API_DEVICE: another build of the library and zeroshard.device (torch_cuda_emu.sh)
PYTHONPATH=$here/../python${PYTHONPATH:+:$PYTHONPATH} ZEROSHARD_LIB=${TORCH_API_LIB:-$LIBDIR/libzeroshard.so} \
  ZEROSHARD_SPILL_DIR=$tmp TORCH_API_DEVICE=${TORCH_API_DEVICE:-} mpirun --oversubscribe -np $np -x PYTHONPATH \
  -x ZEROSHARD_LIB -x ZEROSHARD_SPILL_DIR -x TORCH_API_DEVICE python3 \
  $([ "$MODE" = report ] && echo "$here/torch_memory.py" || echo "$here/torch_zero.py $MODE")

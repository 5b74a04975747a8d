#!/usr/bin/env bash
# torch_zero.sh MODE LIBDIR - zeroshard.zero (Init, GatheredParameters) and zeroshard.utils checks
# (tests/torch_zero.py MODE) under mpirun, with the package from python/ and libzeroshard from LIBDIR (the
# build tree). Exits 77 when torch cannot be imported (tools/setup_tests.sh installs it).
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
if ! err=$(python3 -c 'import torch' 2>&1); then
  echo "torch_zero: skipped: torch cannot be imported by python3 (${err##*$'\n'}); bash tools/setup_tests.sh installs it"
  exit 77
fi
export PYTHONPATH=$here/../python${PYTHONPATH:+:$PYTHONPATH} ZEROSHARD_LIB=$LIBDIR/libzeroshard.so
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# zero.Init's spill files go under the build tree (on disk, not in memory), in a scratch dir
export ZEROSHARD_SPILL_DIR=$(mktemp -d "$LIBDIR/torch_zero_spill.XXXX")
trap 'rm -rf "$ZEROSHARD_SPILL_DIR"' EXIT
case $MODE in
  memory) np=4 ;;
  parity|gather|utils) np=2 ;;
  *) echo "torch_zero.sh: unknown mode $MODE"; exit 2 ;;
esac
mpirun --oversubscribe -np $np -x ZEROSHARD_SPILL_DIR python3 "$here/torch_zero.py" "$MODE"

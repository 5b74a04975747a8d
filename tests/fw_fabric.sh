#!/usr/bin/env bash
# fw_fabric.sh MODE LIBDIR - Lightning Fabric on ZeroShard: examples/pytorch/fortunes_fabric.py driven by
# tests/fw_fabric.py under mpirun (2 ranks), with the package from python/ and libzeroshard from LIBDIR. MODE
# all: parity (ddp against stages 0-3, saving at stage 3), then resume in a fresh mpirun (plus LoRA and misuse).
# Exits 77 (skip) when lightning, transformers or peft cannot be imported: tools/setup_tests.sh installs them.
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
py_test_env fw_fabric "torch, lightning, transformers, peft" "$LIBDIR"
if [ ! -d /usr/share/games/fortunes ]; then
  echo "fw_fabric: SKIP: no /usr/share/games/fortunes (apt-get install fortunes)"
  exit 77
fi
export PYTHONWARNINGS=ignore
run="mpirun --oversubscribe -np 2 python3 $here/fw_fabric.py"
case $MODE in
  all)
    $run parity "$tmp" && $run resume "$tmp" ;;
  *) echo "fw_fabric.sh: unknown mode $MODE"; exit 2 ;;
esac

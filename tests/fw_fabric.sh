#!/usr/bin/env bash
# fw_fabric.sh MODE LIBDIR - Lightning Fabric on ZeroShard: examples/pytorch/fortunes_fabric.py driven by
# tests/fw_fabric.py under mpirun (2 ranks), with the package from python/ and libzeroshard from LIBDIR. MODE
# all: parity (ddp against stages 0-3, saving at stage 3), then resume in a fresh mpirun (plus LoRA and misuse).
# Exits 77 (skip) when lightning, transformers or peft cannot be imported: tools/setup_tests.sh installs them.
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
need="torch, lightning, transformers, peft"
if ! err=$(python3 -c "import $need" 2>&1); then
  echo "fw_fabric: SKIP: python3 cannot import $need (${err##*$'\n'}); bash tools/setup_tests.sh installs them"
  exit 77
fi
if [ ! -d /usr/share/games/fortunes ]; then
  echo "fw_fabric: SKIP: no /usr/share/games/fortunes (apt-get install fortunes)"
  exit 77
fi
export PYTHONPATH=$here/../python${PYTHONPATH:+:$PYTHONPATH} ZEROSHARD_LIB=$LIBDIR/libzeroshard.so
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1
export PYTHONWARNINGS=ignore
run="mpirun --oversubscribe -np 2 python3 $here/fw_fabric.py"
case $MODE in
  all)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    $run parity "$tmp" && $run resume "$tmp" ;;
  *) echo "fw_fabric.sh: unknown mode $MODE"; exit 2 ;;
esac

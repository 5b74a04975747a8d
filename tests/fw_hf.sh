#!/usr/bin/env bash
# fw_hf.sh MODE LIBDIR - zeroshard.hf.Trainer (tests/fw_hf.py MODE) under mpirun at 2 ranks (misuse: one
# process), with the package from python/ and libzeroshard from LIBDIR (the build tree). Exits 77 (skip) when
# torch, transformers, accelerate (or peft, for ckpt's LoRA) cannot be imported: tools/setup_tests.sh installs them.
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
need="torch, transformers, accelerate"
[ "$MODE" = ckpt ] && need="$need, peft"
if ! err=$(python3 -c "import $need" 2>&1); then
  echo "fw_hf: SKIP: python3 cannot import $need (${err##*$'\n'}); bash tools/setup_tests.sh installs them"
  exit 77
fi
export PYTHONPATH=$here/../python${PYTHONPATH:+:$PYTHONPATH} ZEROSHARD_LIB=$LIBDIR/libzeroshard.so
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1
export OMP_NUM_THREADS=1   # two ranks on a small machine; Accelerate would otherwise pick and warn
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case $MODE in
  parity|ckpt) mpirun --oversubscribe -np 2 python3 "$here/fw_hf.py" "$MODE" "$tmp" ;;
  misuse) python3 "$here/fw_hf.py" misuse "$tmp" ;;
  *) echo "fw_hf.sh: unknown mode $MODE"; exit 2 ;;
esac

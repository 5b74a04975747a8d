#!/usr/bin/env bash
# fw_hf.sh MODE LIBDIR - zeroshard.hf.Trainer (tests/fw_hf.py MODE): parity and ckpt at 2 ranks under mpirun,
# misuse in one process; the package from python/, libzeroshard from LIBDIR (the build tree). Skips (77) when
# python3 lacks transformers or accelerate (ckpt: peft too); tools/setup_tests.sh installs the pinned ones.
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
modules="torch, transformers, accelerate"
[ "$MODE" = ckpt ] && modules="$modules, peft"
py_test_env fw_hf "$modules" "$LIBDIR"
export OMP_NUM_THREADS=1   # Accelerate picks (and warns) otherwise; the ranks share a small machine
case $MODE in
  parity|ckpt) mpirun --oversubscribe -np 2 python3 "$here/fw_hf.py" "$MODE" "$tmp" ;;
  misuse) python3 "$here/fw_hf.py" misuse "$tmp" ;;
  *) echo "fw_hf.sh: unknown mode $MODE"; exit 2 ;;
esac

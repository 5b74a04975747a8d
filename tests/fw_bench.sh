#!/usr/bin/env bash
# fw_bench.sh MODE LIBDIR - bench/fortunes_table.py, briefly: the walk-through's table for two of its rows
# (Fabric's ddp and ZeroShard stage 2 through Fabric), 2 steps, 1 rep, a tiny model; passes when the bench
# exits 0 and the table holds a measured line for each row. Exits 77 (skip) when torch, transformers or
# lightning cannot be imported (tools/setup_tests.sh installs them) or the Fabric example is not in the tree.
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$here/..
if ! err=$(python3 -c "import torch, transformers, lightning" 2>&1); then
  echo "fw_bench: SKIP: python3 cannot import torch, transformers, lightning (${err##*$'\n'}); bash tools/setup_tests.sh installs them"
  exit 77
fi
if [ ! -f "$root/examples/pytorch/fortunes_fabric.py" ]; then
  echo "fw_bench: SKIP: examples/pytorch/fortunes_fabric.py (the Fabric example the table runs) is not in this tree"
  exit 77
fi
export ZEROSHARD_LIB=$LIBDIR/libzeroshard.so TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1
case $MODE in
  smoke)
    rows="fabric:ddp fabric:zeroshard_stage_2"
    out=$(python3 "$root/bench/fortunes_table.py" --steps 2 --reps 1 --rows "${rows// /,}" \
          --flags "--dim 32 --layers 1 --heads 2 --seq 32 --micro-batch 4 --no-eval" 2>&1)
    rc=$?
    echo "$out"
    [ $rc = 0 ] || { echo "fw_bench smoke: the bench exited $rc"; exit 1; }
    for r in $rows; do
      # | script | strategy | a time ...: a measured line, not a "no RESULT" one
      echo "$out" | grep -Eq "^\| ${r%%:*} \| ${r#*:} \| [0-9]" ||
        { echo "fw_bench smoke: no measured table line for $r"; exit 1; }
    done
    echo "fw_bench smoke: passed (a table line for each of $rows)" ;;
  *) echo "fw_bench.sh: unknown mode $MODE"; exit 2 ;;
esac

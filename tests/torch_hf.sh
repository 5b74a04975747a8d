#!/usr/bin/env bash
# torch_hf.sh MODE LIBDIR - Hugging Face models through the PyTorch front end (tests/torch_hf.py MODE) under
# mpirun, with the package from python/ and libzeroshard from LIBDIR (the build tree). Exits 77 (skip) when
# torch or transformers (or peft, for lora) cannot be imported: tools/setup_tests.sh installs them.
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
need="torch, transformers"
[ "$MODE" = lora ] && need="$need, peft"
if ! err=$(python3 -c "import $need" 2>&1); then
  echo "torch_hf: SKIP: python3 cannot import $need (${err##*$'\n'}); bash tools/setup_tests.sh installs them"
  exit 77
fi
export PYTHONPATH=$here/../python${PYTHONPATH:+:$PYTHONPATH} ZEROSHARD_LIB=$LIBDIR/libzeroshard.so
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1
run="mpirun --oversubscribe -np"
py="python3 $here/torch_hf.py"
case $MODE in
  distilbert|lora|trainer|accelerate|actckpt) $run 2 $py "$MODE" ;;
  resume|resume-hf)
    # saved by 2 ranks at stage 3, loaded mid-training by 3 ranks at stage 2
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    $run 2 $py "$MODE-save" "$tmp" && $run 3 $py "$MODE-load" "$tmp" ;;
  misuse) $py misuse ;;   # no mpirun: a world of one
  finetune)
    # the example, briefly: 6 steps at 2 ranks (stage 3), saved under its tag; resumed to 10 at 3 ranks
    # (stage 2), with the same global batch (2 x 6 = 3 x 4)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    ex="python3 $here/../examples/pytorch/finetune.py --layers 2 --dim 64 --ctx 32 --save-dir $tmp/ck --metrics $tmp/m.jsonl"
    $run 2 $ex --steps 6 --stage 3 --micro-batch 6 && $run 3 $ex --steps 10 --stage 2 --micro-batch 4 --resume &&
    python3 - "$tmp/m.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows]
assert steps == list(range(1, 11)), f"torch_hf finetune: steps {steps}, expected 1..10 (resumed after 6)"
assert rows[-1]["loss"] < rows[0]["loss"], f"torch_hf finetune: loss {rows[0]['loss']} -> {rows[-1]['loss']}"
print(f"torch_hf finetune: passed (loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, resumed after step 6)")
PY
    ;;
  *) echo "torch_hf.sh: unknown mode $MODE"; exit 2 ;;
esac

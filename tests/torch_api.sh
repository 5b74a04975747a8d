#!/usr/bin/env bash
# torch_api.sh MODE LIBDIR - the PyTorch front end's checks (tests/torch_api.py MODE) under mpirun, with the
# package from python/ and libzeroshard from LIBDIR (the build tree). Exits 77 when torch cannot be imported
# (tools/setup_tests.sh installs it).
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
if ! err=$(python3 -c 'import torch' 2>&1); then
  echo "torch_api: skipped: torch cannot be imported by python3 (${err##*$'\n'}); bash tools/setup_tests.sh installs it"
  exit 77
fi
# TORCH_API_LIB: another build of the library (torch_cuda_emu.sh: the one over the CUDA emulator)
export PYTHONPATH=$here/../python${PYTHONPATH:+:$PYTHONPATH} ZEROSHARD_LIB=${TORCH_API_LIB:-$LIBDIR/libzeroshard.so}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run="mpirun --oversubscribe -np"
case $MODE in
  stages)
    # NVMe offload's swap files go under the build tree (on disk, where O_DIRECT works), in a scratch dir
    export TORCH_API_NVME=$(mktemp -d "$LIBDIR/torch_api_nvme.XXXX")
    trap 'rm -rf "$TORCH_API_NVME"' EXIT
    $run 2 -x TORCH_API_NVME python3 "$here/torch_api.py" stages ;;
  semantics) $run 2 python3 "$here/torch_api.py" semantics ;;
  ckpt)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    $run 2 python3 "$here/torch_api.py" ckpt-save "$tmp" && $run 1 python3 "$here/torch_api.py" ckpt-load "$tmp" ;;
  export)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    $run 2 python3 "$here/torch_api.py" export "$tmp" ;;
  client|frozen|accum|dist) $run 2 python3 "$here/torch_api_surface.py" "$MODE" ;;
  # ZS_TIMEOUT: a rank left waiting in a collective ends in seconds rather than the default 600
  robust|precision|checkpointing) $run 2 -x ZS_TIMEOUT=30 python3 "$here/torch_api_robust.py" "$MODE" &&
    if [ "$MODE" = robust ]; then
      # an uncaught exception on rank 0: the job must end on its notice, not on rank 1's 300 s timeout
      out=$($run 2 -x ZS_TIMEOUT=300 python3 "$here/torch_api_robust.py" uncaught 2>&1)
      if grep -q 'exiting without the collective end' <<< "$out" && ! grep -q 'did not complete in' <<< "$out"; then
        echo "torch_api: uncaught exception on rank 0: the job ended on its notice"
      else
        echo "$out" | tail -20; echo "torch_api: FAIL: an uncaught exception on rank 0 did not end the job"; false
      fi
    fi ;;
  tags)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    $run 2 python3 "$here/torch_api_surface.py" tags "$tmp/ck" ;;
  misuse) python3 "$here/torch_api.py" misuse ;;   # no mpirun: a world of one
  boundary) python3 "$here/torch_api.py" boundary ;;
  window)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    $run 2 python3 "$here/torch_api_window.py" "$tmp" ;;
  install)
    # pip install ./python without its library (wheel.cmake=false; into a scratch target) + cmake --install
    # (into a scratch prefix): the installed package finds the installed library through ZEROSHARD_PREFIX and
    # runs the misuse checks (pkg_install covers the package that ships its library)
    python3 -c 'import scikit_build_core' 2> /dev/null || { echo "torch_api: skipped: no scikit-build-core for pip install"; exit 77; }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cmake --install "$LIBDIR" --prefix "$tmp/prefix" > "$tmp/install.log" &&
      python3 -m pip install -q --no-build-isolation -C wheel.cmake=false --target "$tmp/site" "$here/../python" \
        > "$tmp/pip.log" 2>&1 || { cat "$tmp/install.log" "$tmp/pip.log"; exit 1; }
    (cd "$tmp" && unset ZEROSHARD_LIB && PYTHONPATH=$tmp/site ZEROSHARD_PREFIX=$tmp/prefix python3 -c \
      'import zeroshard, zeroshard._lib as L; L.lib(); print("torch_api install: package", zeroshard.__file__, "library", L._lib._name)' &&
      unset ZEROSHARD_LIB && PYTHONPATH=$tmp/site ZEROSHARD_PREFIX=$tmp/prefix python3 "$here/torch_api.py" misuse) ;;
  example)
    # the DeepSpeed-style example, unchanged, 2 ranks at stage 3: 8 steps, saved, resumed to 12 at stage 0
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    ex=$here/../examples/pytorch
    args="--layers 2 --dim 32 --heads 2 --ctx 32 --data $here/data/parity.txt"
    $run 2 python3 "$ex/train_gpt.py" --config "$ex/ds_zero3.json" $args --steps 8 --save-dir "$tmp/ck" \
      --metrics "$tmp/a.jsonl" | grep -v '^zeroshard:' &&
    $run 2 python3 "$ex/train_gpt.py" --config "$ex/ds_zero0.json" $args --steps 12 --load "$tmp/ck" \
      --metrics "$tmp/a.jsonl" | grep -v '^zeroshard:' &&
    python3 - "$tmp/a.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows]
assert steps == list(range(1, 13)), f"torch_api example: steps {steps}, expected 1..12 (resumed at 9)"
assert rows[-1]["loss"] < rows[0]["loss"] - 0.5, f"torch_api example: loss {rows[0]['loss']} -> {rows[-1]['loss']}"
print(f"torch_api example: passed (loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, resumed at step 9)")
PY
    ;;
  *) echo "torch_api.sh: unknown mode $MODE"; exit 2 ;;
esac

#!/usr/bin/env bash
# gpt_bench.sh [BUILD_DIR] [gpt_bench.py options] - the transformer benchmark: zs-train-gpt at
# stages 0/2/3, 1 and 2 ranks, fp32 and bf16, beside PyTorch single-process, DDP and FSDP on the same model,
# batch, threads and data (bench/gpt_bench.py). Needs torch (bash tools/setup_tests.sh). About 8 minutes on
# 2 cores with the defaults (--steps 5 --reps 2).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
shift || true
python3 -c 'import torch' 2> /dev/null || { echo "gpt_bench: torch cannot be imported: bash tools/setup_tests.sh" >&2; exit 1; }
[ -x "$build/zs-train-gpt" ] || { echo "gpt_bench: no $build/zs-train-gpt: bash tools/build.sh $build" >&2; exit 1; }
echo "command: bash bench/gpt_bench.sh $build $*"
exec python3 "$root/bench/gpt_bench.py" --build "$(cd "$build" && pwd)" "$@"

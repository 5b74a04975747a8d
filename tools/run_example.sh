#!/usr/bin/env bash
# run_example.sh [RANKS] [CONFIG] - builds ZeroShard and trains the example MLP under mpirun
# (default: 2 ranks, ZeRO stage 2), printing per-rank memory, the loss per step and the params-hash.
set -eu
cd "$(dirname "$0")/.."
ranks=${1:-2}
config=${2:-examples/configs/zero2.json}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
bash tools/build.sh build > /dev/null
exec mpirun --oversubscribe -np "$ranks" build/zs-train-mlp --config "$config" --steps 100 --memory-json

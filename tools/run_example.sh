#!/usr/bin/env bash
# run_example.sh [RANKS] [CONFIG] [extra flags...] - builds ZeroShard and trains the GPT-2-style byte-level
# transformer under mpirun (default: 2 ranks, ZeRO stage 3, bf16) on the default corpus (Debian's fortunes),
# printing per-rank memory, the corpus's unigram entropy, one line per step, validation loss, a generated
# sample and the params-hash; the per-step metrics go to gpt_metrics.jsonl (tools/plot_loss.sh draws them).
set -eu
cd "$(dirname "$0")/.."
ranks=${1:-2}
config=${2:-examples/configs/gpt_zero3_bf16.json}
shift 2 || shift $# || true
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# only the program: the tests are tools/test.sh's to build
ZS_BUILD_TARGETS=zs-train-gpt bash tools/build.sh build > /dev/null
# the recipe (README, "The main job's recipe"): width 96 on 1.5 times the bytes of width 128 for about the same
# CPU, lr 6e-3; the sample at temperature 0.7 from the likeliest bytes holding 80% of the probability
exec mpirun --oversubscribe -np "$ranks" build/zs-train-gpt --config "$config" --dim 96 --steps 6000 --lr 6e-3 \
  --val-every 100 --sample 300 --temperature 0.7 --top-p 0.8 --metrics gpt_metrics.jsonl --memory-json "$@"

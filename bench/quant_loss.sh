#!/usr/bin/env bash
# quant_loss.sh [BUILD] [STEPS] [PNG] - the GPT example's loss with ZeRO++'s int8 collectives
# (zero_quantized_weights + zero_quantized_gradients) against the same run unquantized: the main job's recipe
# (tools/run_example.sh: width 96, lr 6e-3, bf16, ZeRO-3) at 4 ranks as 2 nodes of 2 (ZS_FAKE_NODE_SIZE=2, so
# the quantized path has a node boundary to cross), the same seed and data. Prints the train (mean of the
# last 50 steps) and validation losses side by side, the final difference and both runs' counted traffic,
# and draws both curves into PNG (default quant_loss.png) when gnuplot is there. Default 1500 steps.
set -eu
cd "$(dirname "$0")/.."
B=${1:-build} STEPS=${2:-1500} PNG=${3:-quant_loss.png}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export ZS_FAKE_NODE_SIZE=2
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
base=examples/configs/gpt_zero3_bf16.json
sed 's/"stage": 3,/"stage": 3, "zero_quantized_weights": true, "zero_quantized_gradients": true,/' $base > "$d/quant.json"
grep -q zero_quantized_weights "$d/quant.json" || { echo "quant_loss: could not derive the quantized config" >&2; exit 1; }
cp $base "$d/plain.json"
for c in plain quant; do
  start=$SECONDS
  mpirun --oversubscribe -np 4 "$B/zs-train-gpt" --config "$d/$c.json" --dim 96 --steps "$STEPS" --lr 6e-3 \
    --val-every 100 --sample 0 --metrics "$d/$c.jsonl" > "$d/$c.out" 2>&1 || { tail -5 "$d/$c.out"; exit 1; }
  echo "$c: $STEPS steps in $((SECONDS - start)) s"
done
# one line per validated step: step, train loss (mean of the last 50 steps), validation loss
table() {
  sed -n 's/.*"step": \([0-9]*\),.*"loss": \([-0-9.e+]*\),\(.*"val_loss": \([-0-9.e+]*\)\)\{0,1\}.*/\1 \2 \4/p' "$1" |
    awk '{ring[NR % 50] = $2; n = NR < 50 ? NR : 50; s = 0; for (i in ring) s += ring[i]
          if ($3 != "") printf "%d %.4f %.4f\n", $1, s / n, $3}'
}
table "$d/plain.jsonl" > "$d/plain.tab"
table "$d/quant.jsonl" > "$d/quant.tab"
echo "command: bash bench/quant_loss.sh $B $STEPS   (4 ranks, ZS_FAKE_NODE_SIZE=2, bf16, ZeRO-3, width 96)"
echo "| step | train, unquantized | train, int8 | validation, unquantized | validation, int8 |"
echo "|---|---|---|---|---|"
join "$d/plain.tab" "$d/quant.tab" | awk '{printf "| %d | %.4f | %.4f | %.4f | %.4f |\n", $1, $2, $4, $3, $5}'
join "$d/plain.tab" "$d/quant.tab" | tail -n 1 |
  awk '{printf "final validation loss: int8 - unquantized = %+.4f (%+.2f%%)\n", $5 - $3, 100 * ($5 - $3) / $3}'
for c in plain quant; do echo "$c: $(grep -m1 '^traffic' "$d/$c.out")"; done
if command -v gnuplot > /dev/null; then
  gnuplot <<GP
set terminal png size 900,540 noenhanced
set output '$PNG'
set title 'zs-train-gpt, 4 ranks as 2 nodes, ZeRO-3 bf16: loss with and without int8 collectives'
set xlabel 'optimizer step'; set ylabel 'mean cross-entropy (nats per byte)'; set key top right; set grid
plot '$d/plain.tab' using 1:2 with lines lw 2 title 'train, unquantized', \
     '$d/quant.tab' using 1:2 with lines lw 2 dt 2 title 'train, int8 (zero_quantized_weights + _gradients)', \
     '$d/plain.tab' using 1:3 with linespoints lw 2 pt 7 title 'validation, unquantized', \
     '$d/quant.tab' using 1:3 with linespoints lw 2 pt 6 dt 2 title 'validation, int8'
GP
  echo "curves: $PNG"
fi

#!/usr/bin/env bash
# plot_loss.sh [METRICS] [PNG] - draws the training and validation loss of a zs-train-gpt --metrics file
# (one JSON line per step; default gpt_metrics.jsonl) into a PNG (default gpt_loss.png) with gnuplot
# (Debian's gnuplot-nox, installed by tools/setup.sh).
set -eu
metrics=${1:-gpt_metrics.jsonl}
png=${2:-gpt_loss.png}
command -v gnuplot > /dev/null || { echo "plot_loss: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
[ -s "$metrics" ] || { echo "plot_loss: $metrics is missing or empty" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# the metrics' keys are fixed and flat: pick fields by name with sed, no JSON parser needed
sed -n 's/.*"step": \([0-9]*\),.*"loss": \([-0-9.e+]*\),.*/\1 \2/p' "$metrics" > "$dir/train.dat"
sed -n 's/.*"step": \([0-9]*\),.*"val_loss": \([-0-9.e+]*\).*/\1 \2/p' "$metrics" > "$dir/val.dat"
val_plot=""
[ -s "$dir/val.dat" ] && val_plot=", '$dir/val.dat' using 1:2 with linespoints lw 2 pt 7 title 'validation'"
gnuplot <<GP
set terminal png size 900,540
set output '$png'
set title 'zs-train-gpt: mean cross-entropy (nats per byte)'
set xlabel 'optimizer step'
set ylabel 'loss (nats)'
set grid
plot '$dir/train.dat' using 1:2 with lines lw 1 title 'train' $val_plot
GP
echo "plot_loss: wrote $png ($(wc -l < "$dir/train.dat") steps, $(wc -l < "$dir/val.dat") validation points)"

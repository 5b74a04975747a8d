#!/usr/bin/env bash
# scale_demo.sh [NVME_DIR] - ZeRO-Infinity on one small machine: zs-train-gpt at 1.89 billion parameters
# (24 layers, width 2560, 20 heads, context 64, byte vocabulary), whose fp32 parameters + gradients + Adam
# state come to 28 GiB per rank at stage 0 (16 bytes a parameter), more than this machine's 23.5 GiB of
# RAM. First stage 0 at that size must refuse to start with the out-of-memory message; then 2 ranks
# train it on the default corpus at stage 3 with the optimizer state and the parameter shards on NVMe
# (examples/configs/zero3_nvme.json, lr 1e-6, micro-batch 1), printing the memory table, one line per
# step with its compute / communication / optimizer / swap split, the validation loss, each rank's peak
# RSS, the peak bytes under NVME_DIR and that the swap directories are gone at the end. Needs about
# 22 GiB free under NVME_DIR (default /var/tmp/zeroshard-nvme) and about 15 GiB of free RAM.
#
# One run here (2 cores, 23.5 GiB RAM, virtual disk; load average 11-16 from other jobs, so times vary):
#   bash tools/scale_demo.sh
#   stage 0: "out of memory: stage 0 needs 28.15 GiB per rank, but this node's 23.54 GiB of RAM gives each
#   of its 2 ranks 11.77 GiB; ..."; stage 3 per rank: params 0.02 MiB + 3626 MiB on NVMe [formula 3603 MiB],
#   grads 3603 MiB [3603 MiB], optimizer 7229 MiB on NVMe [7206 MiB]; loss 6.1363, 5.1963, 4.0889, 4.0025,
#   val_loss 3.9768; steps 87.2, 67.8, 68.7, 102.8 s (optimizer 14-22 s, waiting on NVMe 17-32 s of each);
#   peak RSS 7.22 GB per rank; 22.8 GB of swap files, removed at exit; 613 s for the stage-3 run.
# ZS_SCALE_SIZE (the model flags) and ZS_SCALE_STEPS (default 4) change the run, for trying the script
# on a small model (with ZS_DEVICE_MEMORY set between the two stages' needs so stage 0 is still refused).
set -u
cd "$(dirname "$0")/.."
dir=${1:-/var/tmp/zeroshard-nvme}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
bash tools/build.sh build > /dev/null || exit 1
mkdir -p "$dir" || exit 1
cfg=$(mktemp --suffix=.json)
du_log=$(mktemp)
trap 'rm -f "$cfg" "$du_log"' EXIT
sed "s#/var/tmp/zeroshard-nvme#$dir#g" examples/configs/zero3_nvme.json > "$cfg"
read -r -a size <<< "${ZS_SCALE_SIZE:---layers 24 --dim 2560 --heads 20 --ctx 64}"
steps=${ZS_SCALE_STEPS:-4}
echo "== load before: $(uptime)"

echo "== stage 0 at the same size (expected: refused at start)"
mpirun --oversubscribe -np 2 build/zs-train-gpt --config examples/configs/zero0.json "${size[@]}" --steps "$steps"
rc=$?
if [ $rc -eq 0 ]; then echo "scale_demo: stage 0 was expected to fail" >&2; exit 1; fi

echo "== stage 3, optimizer state and parameters on NVMe under $dir"
# the bytes under dir every 2 s, for the peak (the files are written in full at start, so this is their size)
(while sleep 2; do du -sB1 "$dir" 2> /dev/null | cut -f1; done) > "$du_log" &
sampler=$!
t0=$(date +%s.%N)
# each rank under /usr/bin/time, which reports that rank's peak resident set
mpirun --oversubscribe -np 2 bash -c 'exec /usr/bin/time -f "rank $OMPI_COMM_WORLD_RANK: peak RSS %M KiB, %e s" "$@"' \
  _ build/zs-train-gpt --config "$cfg" "${size[@]}" --micro-batch 1 --steps "$steps" --val-every 0 --val-batches 1 \
  --sample 0 --memory-json
rc=$?
t1=$(date +%s.%N)
kill "$sampler" 2> /dev/null
wait "$sampler" 2> /dev/null
printf "== wall time of the stage-3 run: %.1f s, exit code %d\n" "$(echo "$t1 - $t0" | bc)" "$rc"
echo "== peak bytes under $dir during the run: $(sort -n "$du_log" | tail -n 1)"
left=$(find "$dir" -maxdepth 1 -name 'zeroshard-rank*' 2> /dev/null)
echo "== swap directories left under $dir: ${left:-none}"
echo "== load after: $(uptime)"
[ $rc -eq 0 ] && [ -z "$left" ]

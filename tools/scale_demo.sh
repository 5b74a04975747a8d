#!/usr/bin/env bash
# scale_demo.sh [NVME_DIR] - ZeRO-Infinity on one small machine: the example MLP at 2.08 billion
# parameters (hidden 8192, 32 layers), whose fp32 parameters + gradients + Adam state come to 31 GiB
# (16 bytes a parameter), more than this machine's RAM. First stage 0 at that size must refuse to start
# with the out-of-memory message; then 4 ranks train it for 3 steps at stage 3 with the optimizer state
# and the parameter shards on NVMe (examples/configs/zero3_nvme.json), printing per-rank memory and the
# step times. Needs about 26 GiB free under NVME_DIR (default /var/tmp/zeroshard-nvme).
set -u
cd "$(dirname "$0")/.."
dir=${1:-/var/tmp/zeroshard-nvme}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
bash tools/build.sh build > /dev/null || exit 1
mkdir -p "$dir" || exit 1
cfg=$(mktemp --suffix=.json)
trap 'rm -f "$cfg"' EXIT
sed "s#/var/tmp/zeroshard-nvme#$dir#g" examples/configs/zero3_nvme.json > "$cfg"
size=(--hidden 8192 --layers 32)

echo "== stage 0 at the same size (expected: refused at start)"
mpirun --oversubscribe -np 4 build/zs-train-mlp --config examples/configs/zero0.json "${size[@]}" --steps 3
rc=$?
if [ $rc -eq 0 ]; then echo "scale_demo: stage 0 was expected to fail" >&2; exit 1; fi

echo "== stage 3, optimizer state and parameters on NVMe under $dir"
/usr/bin/time -v mpirun --oversubscribe -np 4 build/zs-train-mlp --config "$cfg" "${size[@]}" --steps 3 \
  --memory-json 2> >(grep -E "Maximum resident|Elapsed" >&2)

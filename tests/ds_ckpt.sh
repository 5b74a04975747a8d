#!/usr/bin/env bash
# ds_ckpt.sh STAGE LIBDIR - DeepSpeed 0.19.8 trains and saves a ZeRO-STAGE checkpoint on 2 CPU ranks (torchrun);
# ZeroShard resumes it at 2 and at 3 ranks and reads it with zero_to_fp32, and refuses damaged copies naming
# the file (tests/ds_ckpt.py has the modes). Exits 77, saying why, without torch or deepspeed.
set -u
STAGE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
for mod in torch deepspeed; do
  if ! err=$(python3 -c "import $mod" 2>&1); then
    echo "ds_ckpt: SKIPPED: $mod cannot be imported by python3 (${err##*$'\n'}); the DeepSpeed side needs" \
         "python3 -m pip install deepspeed==0.19.8"
    exit 77
  fi
done
export PYTHONPATH=$here/../python${PYTHONPATH:+:$PYTHONPATH} ZEROSHARD_LIB=$LIBDIR/libzeroshard.so
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DS_ACCELERATOR=cpu
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# DeepSpeed's CPU ranks leave their shared-memory all-reduce buffers (69 MB each) in /dev/shm: removed by port
trap 'rm -rf "$tmp" /dev/shm/deepspeed_allreduce_buffer_*_"$port"_*' EXIT
# DeepSpeed's side must not see the MPI launcher's variables, nor ZeroShard's library
torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" "$here/ds_ckpt.py" ds "$STAGE" "$tmp" \
  > "$tmp/ds.log" 2>&1 || { tail -40 "$tmp/ds.log"; echo "ds_ckpt: FAIL: DeepSpeed's run"; exit 1; }
grep '^ds_ckpt' "$tmp/ds.log"
for n in 2 3; do
  mpirun --oversubscribe -np $n python3 "$here/ds_ckpt.py" zs "$STAGE" "$tmp" || exit 1
done
mpirun --oversubscribe -np 2 -x ZS_TIMEOUT=60 python3 "$here/ds_ckpt.py" errors "$STAGE" "$tmp" || exit 1
echo "ds_ckpt: stage $STAGE: PASS"

#!/usr/bin/env bash
# torch_cuda_emu.sh MODE LIBDIR - the PyTorch front end on `zeroshard.device: "cuda"` over the CUDA emulator:
# tests/torch_cuda_emu.py's modes, and torch_api.sh's and torch_api_surface.py's checks run again with
# TORCH_API_DEVICE=cuda (api-stages, api-client, api-frozen, api-tags, api-accum; zero-parity and zero-gather
# from torch_zero.sh: zero.Init and GatheredParameters), all with
# LIBDIR/tests/libzeroshard_cudaemu.so. Exits 77 when torch cannot be imported.
set -u
MODE=$1 LIBDIR=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
py_test_env torch_cuda_emu torch "$LIBDIR"
emu=$LIBDIR/tests/libzeroshard_cudaemu.so
[ -f "$emu" ] || { echo "torch_cuda_emu: $emu is missing (built by tests/CMakeLists.txt)"; exit 1; }
export ZEROSHARD_LIB=$emu
run="mpirun --oversubscribe -np"
case $MODE in
  parity) # the swap files in lib.sh's scratch dir, on the disk under test (O_DIRECT)
    TORCH_CUDA_EMU_NVME=$tmp $run 2 -x TORCH_CUDA_EMU_NVME python3 "$here/torch_cuda_emu.py" parity ;;
  fault) $run 1 python3 "$here/torch_cuda_emu.py" fault ;;
  nccl) $run 2 -x ZS_CUDA_EMU_GPUS=2 -x ZS_CUDA_EMU_NCCL=1 python3 "$here/torch_cuda_emu.py" nccl ;;
  nccl_fault) $run 2 -x ZS_CUDA_EMU_GPUS=2 -x ZS_CUDA_EMU_NCCL=1 -x ZS_CUDA_EMU_NCCL_FAULT=1:3 -x ZS_TIMEOUT=15 \
                python3 "$here/torch_cuda_emu.py" nccl_fault ;;
  api-*) TORCH_API_DEVICE=cuda TORCH_API_LIB=$emu bash "$here/torch_api.sh" "${MODE#api-}" "$LIBDIR" ;;
  zero-*) TORCH_API_DEVICE=cuda TORCH_API_LIB=$emu bash "$here/torch_zero.sh" "${MODE#zero-}" "$LIBDIR" ;;
  *) echo "torch_cuda_emu.sh: unknown mode $MODE"; exit 2 ;;
esac

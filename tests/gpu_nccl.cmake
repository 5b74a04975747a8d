# gpu_nccl.cmake - (filled by its lane)

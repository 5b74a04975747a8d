# gpu_norm.cmake - (filled by its lane)

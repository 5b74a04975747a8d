# gpu_sem.cmake - (filled by its lane)

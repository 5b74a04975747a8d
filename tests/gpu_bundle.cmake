# gpu_bundle.cmake - (filled by its lane)

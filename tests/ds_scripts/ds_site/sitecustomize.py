"""For the DeepSpeed runs of tests/ds_compat.sh only: Accelerate's DeepSpeed path on a CPU gets the gloo backend
zeroshard-run gives it (python/zeroshard/_accelerate_cpu.py, loaded by path: importing zeroshard under
DeepSpeed's launcher is refused), so both runs shard the data over 2 processes and can be compared."""
import importlib.util
import os

_path = os.environ.get("ZS_ACCELERATE_CPU_PY")
if _path:
    _spec = importlib.util.spec_from_file_location("zs_accelerate_cpu", _path)
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
    _mod.install()

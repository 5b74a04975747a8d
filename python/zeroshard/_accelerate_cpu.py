"""Accelerate's DeepSpeed path on a machine without a GPU, under zeroshard-run.

Accelerate picks its process-group backend from the device it finds (nccl for CUDA, ...) and has no CPU
branch for DeepSpeed: with ACCELERATE_USE_DEEPSPEED on a CPU it sets up DeepSpeed's process group but then
counts one process (backend None), so every rank trains on the whole data set and its gather for metrics
fails (gloo is given one output tensor for a world of two). The launcher gives that case the backend Accelerate
gives every other CPU job, gloo over the MULTI_CPU branch, before Accelerate's state is built; everything
else in Accelerate runs as written. Nothing changes when a GPU is present or DeepSpeed is not asked for.
"""
import importlib.abc
import importlib.machinery
import os
import sys

_TARGET = "accelerate.state"


def _patch(state):
    cls = state.PartialState
    if getattr(cls._prepare_backend, "_zeroshard", False):
        return
    orig = cls._prepare_backend

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        got, kind = orig(self, cpu, sagemaker_dp, backend)
        if (got is None and kind == state.DistributedType.NO and not cpu and not sagemaker_dp
                and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
                and int(os.environ.get("LOCAL_RANK", -1)) != -1):
            return "gloo", state.DistributedType.MULTI_CPU
        return got, kind

    _prepare_backend._zeroshard = True
    cls._prepare_backend = _prepare_backend


class _Hook(importlib.abc.MetaPathFinder):
    """Patches accelerate.state right after it is executed, wherever it is first imported from."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec


def install():
    if _TARGET in sys.modules:
        _patch(sys.modules[_TARGET])
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())

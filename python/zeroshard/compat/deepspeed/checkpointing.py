"""deepspeed.checkpointing: activation checkpointing as torch's (zeroshard.checkpointing); configure() accepts
DeepSpeed's defaults and refuses the partitioning, CPU and contiguous variants by name."""
from zeroshard.checkpointing import checkpoint  # noqa: F401

from . import _missing


def configure(mpu_=None, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None):
    for key, value in (("partition_activations", partition_activations),
                       ("contiguous_memory_optimization", contiguous_checkpointing),
                       ("cpu_checkpointing", checkpoint_in_cpu), ("synchronize_checkpoint_boundary", synchronize),
                       ("profile", profile)):
        if value:
            raise _missing.missing(f"deepspeed.checkpointing.configure({key}=True) "
                                   f"(activation_checkpointing.{key})")
    if mpu_ is not None:
        raise _missing.missing("deepspeed.checkpointing.configure(mpu_=...) (model parallelism)")


def is_configured():
    return True


__getattr__ = _missing.module_getattr("deepspeed.checkpointing")

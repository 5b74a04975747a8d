"""deepspeed.runtime.zero.config: ZeroStageEnum (pickled into DeepSpeed's optimizer files)."""
from enum import IntEnum


class ZeroStageEnum(IntEnum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3

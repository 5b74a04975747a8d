"""deepspeed.ops.adam: FusedAdam and DeepSpeedCPUAdam."""
from zeroshard.optim import FusedAdam, DeepSpeedCPUAdam  # noqa: F401

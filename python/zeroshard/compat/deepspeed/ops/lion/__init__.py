"""deepspeed.ops.lion: DeepSpeedCPULion and FusedLion."""
from zeroshard.optim import DeepSpeedCPULion, FusedLion  # noqa: F401

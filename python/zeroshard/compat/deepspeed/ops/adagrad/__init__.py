"""deepspeed.ops.adagrad: DeepSpeedCPUAdagrad."""
from zeroshard.optim import DeepSpeedCPUAdagrad  # noqa: F401

"""deepspeed.runtime.base_optimizer: the base class of what initialize returns as the optimizer."""
from zeroshard.optim import DeepSpeedOptimizer, ZeROOptimizer  # noqa: F401

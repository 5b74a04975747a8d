"""deepspeed.runtime."""
from .. import _missing
from . import zero, lr_schedules, base_optimizer, engine  # noqa: F401

__getattr__ = _missing.module_getattr("deepspeed.runtime")

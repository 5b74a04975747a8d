"""deepspeed.zero and deepspeed.runtime.zero (one module): zero.Init builds a model straight into shards,
GatheredParameters reads and writes full parameters (zeroshard.zero)."""
from zeroshard.zero import Init, GatheredParameters  # noqa: F401

from ... import _missing
from . import partition_parameters, config  # noqa: F401
from .config import ZeroStageEnum  # noqa: F401

register_external_parameter = _missing.refuse("deepspeed.zero.register_external_parameter")
__getattr__ = _missing.module_getattr("deepspeed.zero")

"""deepspeed.utils: the logger, the full-state readers and writers of a parameter (zeroshard.utils), and
zero_to_fp32's conversions (deepspeed.utils.zero_to_fp32)."""
from zeroshard.utils import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,  # noqa: F401
                             safe_set_full_fp32_param, safe_set_full_optimizer_state)

from .. import _missing
from .logging import logger, log_dist  # noqa: F401
from . import groups  # noqa: F401

set_z3_leaf_modules = _missing.refuse("deepspeed.utils.set_z3_leaf_modules (ZeRO-3 leaf modules: ZeroShard's "
                                      "stage 3 gathers each repeated block as one unit already)")
__getattr__ = _missing.module_getattr("deepspeed.utils")

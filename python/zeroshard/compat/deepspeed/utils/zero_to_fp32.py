"""deepspeed.utils.zero_to_fp32: a checkpoint's full fp32 parameters, from a ZeroShard checkpoint or a
DeepSpeed one (zeroshard._ds_ckpt reads both), with DeepSpeed 0.19.8's signatures."""
from zeroshard._ds_ckpt import (convert_zero_checkpoint_to_fp32_state_dict,  # noqa: F401
                                convert_zero_checkpoint_to_state_dict, get_checkpoint_files,
                                get_fp32_state_dict_from_zero_checkpoint, get_model_state_file,
                                get_model_state_files, get_optim_files, load_state_dict_from_zero_checkpoint)

from .. import _missing

__getattr__ = _missing.module_getattr("deepspeed.utils.zero_to_fp32")

"""deepspeed.utils.zero_to_fp32: a checkpoint's full fp32 parameters, from a ZeroShard checkpoint or a
DeepSpeed one (zeroshard._ds_ckpt reads both)."""
from .. import _missing

_NAMES = ("get_fp32_state_dict_from_zero_checkpoint", "convert_zero_checkpoint_to_fp32_state_dict",
          "load_state_dict_from_zero_checkpoint", "get_optim_files", "get_model_state_file",
          "get_model_state_files")


def __getattr__(name):
    if name in _NAMES:
        try:
            from zeroshard import _ds_ckpt
        except ImportError:
            _ds_ckpt = None
        if hasattr(_ds_ckpt, name):
            return getattr(_ds_ckpt, name)
    return _missing.module_getattr("deepspeed.utils.zero_to_fp32")(name)

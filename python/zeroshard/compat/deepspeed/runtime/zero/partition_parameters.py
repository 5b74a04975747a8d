"""deepspeed.runtime.zero.partition_parameters: Init and GatheredParameters, and the two names transformers
reads while it builds a model under Init (its prevent_arange_dtype_change swaps the tensor-constructor
wrapper). ZeroShard's Init keeps each parameter's dtype and device as the model makes them (the engine casts at
initialize), so it wraps no constructors and transformers' swap changes nothing here."""
import functools

import torch

from zeroshard.zero import Init, GatheredParameters  # noqa: F401

from ...accelerator import get_accelerator  # noqa: F401

_orig_torch_arange = torch.arange


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype, target_device=None):
    """DeepSpeed's: fn with floating-point results made in target_fp_dtype on target_device."""
    if target_device is None:
        target_device = torch.device("cpu")

    @functools.wraps(fn)
    def wrapped_fn(*args, **kwargs):
        if kwargs.get("device", None) is None:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        if tensor.is_floating_point():
            tensor = tensor.to(target_fp_dtype)
        return tensor
    return wrapped_fn

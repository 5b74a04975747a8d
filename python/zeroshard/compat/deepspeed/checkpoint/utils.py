"""deepspeed.checkpoint.utils: clone_tensors_for_torch_save (Accelerate saves the model's state_dict with it)."""


def clone_tensors_for_torch_save(item, device=None):
    """The same nested structure with every tensor detached and cloned to `device` (the CPU by default), so that
    torch.save writes each tensor's own elements rather than a shared storage."""
    import torch
    device = torch.device("cpu") if device is None else device
    if torch.is_tensor(item):
        return item.detach().clone().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v, device) for k, v in item.items()})
    return item

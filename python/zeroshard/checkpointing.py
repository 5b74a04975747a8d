"""zeroshard.checkpointing: deepspeed.checkpointing's activation checkpointing, as torch's own (at stage 3 the
recomputed forward fetches its units again and keeps them until their gradients are handed over)."""


def checkpoint(function, *args, use_reentrant=None, **kwargs):
    """torch.utils.checkpoint.checkpoint; DeepSpeed's takes no use_reentrant and re-enters, as torch's
    use_reentrant=True does, which is the default here too."""
    from torch.utils.checkpoint import checkpoint as torch_checkpoint
    return torch_checkpoint(function, *args, use_reentrant=True if use_reentrant is None else use_reentrant,
                            **kwargs)

"""convert_zero_checkpoint_to_fp32_state_dict: Lightning's function of that name
(lightning.pytorch.utilities.deepspeed) for a checkpoint ZeroShardStrategy wrote. Lightning's own reads
DeepSpeed's pickled rank files, which ZeroShard's checkpoints do not have (their rank files are raw fp32):
this reads the parameters with zeroshard's zero_to_fp32 and Lightning's state from the client state, and
writes the same file, which LightningModule.load_from_checkpoint takes."""
import os

# DeepSpeed's engine keys Lightning drops from the client state (ZeroShard's client state never has them)
_ENGINE_KEYS = ("module", "optimizer", "lr_scheduler", "csr_tensor_module_names", "skipped_steps", "global_steps",
                "dp_world_size", "mp_world_size")


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_file, tag=None):
    """checkpoint_dir: what trainer.save_checkpoint(path) or a ModelCheckpoint wrote (the folder holding the
    `checkpoint` tag folder). Writes output_file and returns its contents: Lightning's state with "state_dict",
    every parameter in fp32 under the module's names."""
    import torch
    from .. import _ds_ckpt
    from ._trainer import _TAG
    tag = tag or (_TAG if os.path.isdir(os.path.join(checkpoint_dir, _TAG)) else None)
    state_dict = _ds_ckpt.get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    tag_dir = os.path.join(checkpoint_dir, _ds_ckpt.resolve_tag(checkpoint_dir, tag))
    extra_file = os.path.join(tag_dir, "client_state.pt")
    if not os.path.isfile(extra_file):
        raise FileNotFoundError(f"zeroshard.lightning: '{extra_file}' is missing: '{checkpoint_dir}' is not a "
                                "checkpoint ZeroShardStrategy wrote")
    extra = torch.load(extra_file, map_location="cpu", weights_only=False)
    client = {k: v for k, v in extra.get("client_state", {}).items() if k not in _ENGINE_KEYS}
    client["state_dict"] = {k[len("_forward_module."):] if k.startswith("_forward_module.") else k: v
                            for k, v in state_dict.items()}
    print(f"Saving fp32 state dict to {output_file}")
    torch.save(client, output_file)
    return client

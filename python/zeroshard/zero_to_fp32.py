"""python -m zeroshard.zero_to_fp32 CHECKPOINT_DIR OUTPUT_DIR: DeepSpeed's zero_to_fp32.py, for a ZeroShard
checkpoint or a DeepSpeed one (the folder holding `latest` and the tag folders). Writes pytorch_model.bin (or
model.safetensors with --safe_serialization), sharded past --max_shard_size, as DeepSpeed's script does."""
import argparse

from ._ds_ckpt import convert_zero_checkpoint_to_fp32_state_dict


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m zeroshard.zero_to_fp32", description=__doc__)
    ap.add_argument("checkpoint_dir", help="the folder with `latest` and the tag folders (global_step1, ...)")
    ap.add_argument("output_dir", help="where the consolidated fp32 weights go")
    ap.add_argument("--max_shard_size", default="5GB")
    ap.add_argument("--safe_serialization", action="store_true", help="model.safetensors, not pytorch_model.bin")
    ap.add_argument("-t", "--tag", default=None, help="the tag folder (default: what `latest` names)")
    ap.add_argument("--exclude_frozen_parameters", action="store_true")
    a = ap.parse_args(argv)
    convert_zero_checkpoint_to_fp32_state_dict(a.checkpoint_dir, a.output_dir, max_shard_size=a.max_shard_size,
                                               safe_serialization=a.safe_serialization, tag=a.tag,
                                               exclude_frozen_parameters=a.exclude_frozen_parameters)


if __name__ == "__main__":
    main()

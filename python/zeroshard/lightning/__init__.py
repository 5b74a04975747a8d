"""ZeroShard for Lightning: `ZeroShardStrategy` for the Trainer and `ZeroShardFabricStrategy` for Fabric, and
the names "zeroshard", "zeroshard_stage_0", "zeroshard_stage_1", "zeroshard_stage_2", "zeroshard_stage_2_offload",
"zeroshard_stage_3", "zeroshard_stage_3_offload" registered with both once this module is imported:

    import zeroshard.lightning
    trainer = L.Trainer(strategy="zeroshard_stage_2")            # was: strategy="deepspeed_stage_2"
    fabric = L.Fabric(strategy="zeroshard_stage_3")

Launched with `mpirun -np N python train.py` (the ranks come from MPI; no mpi4py needed).
"""
try:
    import lightning  # noqa: F401
except ImportError as e:   # pragma: no cover - said once, clearly
    raise ImportError("zeroshard.lightning needs the lightning package (pip install 'zeroshard[lightning]')") from e

from ._env import MPIEnvironment  # noqa: E402
from ._fabric import ZeroShardFabricStrategy  # noqa: E402
from ._trainer import ZeroShardStrategy  # noqa: E402
from ._convert import convert_zero_checkpoint_to_fp32_state_dict  # noqa: E402

__all__ = ["ZeroShardStrategy", "ZeroShardFabricStrategy", "MPIEnvironment", "convert_zero_checkpoint_to_fp32_state_dict"]

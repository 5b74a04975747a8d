"""DeepSpeed's API over ZeroShard: what the frameworks' DeepSpeed integrations (transformers, Accelerate,
Lightning) and DeepSpeed-style scripts call, each name standing for the DeepSpeed module it is laid out like.

zeroshard-run puts this folder first on the import path, so that `import deepspeed` is this package for the
script and every library it imports; nothing else does. What is not implemented raises naming the DeepSpeed
name (docs/deepspeed_api.md lists every entry and what ZeroShard does for it).
"""
import argparse

import zeroshard as _zs
from zeroshard import _plan
from zeroshard import ZsError  # noqa: F401

from . import _missing
from . import comm, accelerator, utils, checkpoint, runtime, ops, launcher  # noqa: F401
from .runtime import zero, lr_schedules  # noqa: F401  (deepspeed.zero is deepspeed.runtime.zero)
from .runtime.engine import DeepSpeedEngine  # noqa: F401
from . import checkpointing  # noqa: F401

__zeroshard__ = True
from zeroshard.run import DEEPSPEED_VERSION as __version__  # noqa: E402  (the DeepSpeed release followed)
__version_major__, __version_minor__, __version_patch__ = 0, 19, 8
__git_hash__ = None
__git_branch__ = None
# DeepSpeed 0.19.8 clips at 1.0 when the config has no gradient_clipping (ZeroShard's own default is off)
GRADIENT_CLIPPING_DEFAULT = 1.0


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, distributed_port=29500, mpu=None, dist_init_required=None, collate_fn=None,
               config=None, mesh_param=None, config_params=None):
    """deepspeed.initialize: (engine, optimizer, training_dataloader, lr_scheduler) from ZeroShard's engine."""
    if mesh_param is not None:
        raise _missing.missing("deepspeed.initialize(mesh_param=...) (sequence/tensor parallel meshes)")
    cfg = _plan.initialize_config(args, config, config_params)
    if cfg is not None:
        cfg.setdefault("gradient_clipping", GRADIENT_CLIPPING_DEFAULT)
        config, config_params = cfg, None
    if model_parameters is not None and not isinstance(model_parameters, (list, tuple)):
        model_parameters = list(model_parameters)   # Lightning passes a one-shot filter()
    return _zs.initialize(args=args, model=model, optimizer=optimizer, model_parameters=model_parameters,
                          training_data=training_data, lr_scheduler=lr_scheduler, mpu=mpu,
                          dist_init_required=dist_init_required, collate_fn=collate_fn, config=config,
                          config_params=config_params)


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=29500, verbose=True,
                     timeout=None, init_method=None, dist_init_required=None, config=None, rank=-1, world_size=-1):
    """deepspeed.init_distributed: torch.distributed's gloo group over the MPI world (deepspeed.comm)."""
    return comm.init_distributed(dist_backend=dist_backend, auto_mpi_discovery=auto_mpi_discovery,
                                 distributed_port=distributed_port, verbose=verbose, timeout=timeout,
                                 init_method=init_method, dist_init_required=dist_init_required, config=config,
                                 rank=rank, world_size=world_size)


def add_config_arguments(parser):
    """deepspeed.add_config_arguments: --deepspeed, --deepspeed_config (and the old --deepscale names)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser


tp_model_init = _missing.refuse("deepspeed.tp_model_init (tensor parallelism)")
init_inference = _missing.refuse("deepspeed.init_inference")
__getattr__ = _missing.module_getattr("deepspeed")
_missing.install_finder()

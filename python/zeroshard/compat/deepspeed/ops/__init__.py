"""deepspeed.ops: DeepSpeed's optimizer classes; ZeroShard runs their algorithm on the shards (the class and
its arguments become the config's optimizer)."""
from .. import _missing
from . import adam, adagrad, lion  # noqa: F401

__getattr__ = _missing.module_getattr("deepspeed.ops")

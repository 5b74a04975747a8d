"""deepspeed.checkpoint."""
from . import utils  # noqa: F401

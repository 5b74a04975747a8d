"""deepspeed.utils.tensor_fragment: the class DeepSpeed pickles into stage 1/2 optimizer files (so that they
load here)."""
from dataclasses import dataclass


@dataclass
class fragment_address:
    numel: int
    start: int

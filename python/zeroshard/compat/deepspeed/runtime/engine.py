"""deepspeed.runtime.engine: DeepSpeedEngine is ZeroShard's engine (frameworks test isinstance against it)."""
from zeroshard.engine import ZeroShardEngine as DeepSpeedEngine  # noqa: F401

"""deepspeed.runtime.lr_schedules: the config's schedule names (Accelerate recognises DeepSpeed's schedulers by
them). The config's `scheduler` section runs inside ZeroShard's step; initialize returns an object of the
section's type name reporting it."""
LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]

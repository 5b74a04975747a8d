"""deepspeed.runtime.fp16."""

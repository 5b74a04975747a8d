"""deepspeed.launcher."""

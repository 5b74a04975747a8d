"""deepspeed.launcher.runner: the name of DeepSpeed's environment file (`accelerate launch` reads it)."""
DEEPSPEED_ENVIRONMENT_NAME = ".deepspeed_env"

"""zeroshard.accelerate is retired: Accelerate's own DeepSpeed path runs on ZeroShard's compatibility package."""
raise ImportError(
    "zeroshard.accelerate is retired: use `from accelerate import Accelerator` under "
    "`zeroshard-run -np N --use_deepspeed --deepspeed_config_file ds.json script.py` (or pass "
    "Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds.json)) in the script) (docs/frameworks.md)")

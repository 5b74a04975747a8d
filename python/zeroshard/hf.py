"""zeroshard.hf is retired: transformers' own DeepSpeed integration runs on ZeroShard's compatibility package."""
raise ImportError(
    "zeroshard.hf is retired: run the script unchanged with the transformers Trainer and "
    "TrainingArguments(deepspeed=ds.json) / --deepspeed ds.json under `zeroshard-run -np N script.py ...` "
    "(docs/frameworks.md)")

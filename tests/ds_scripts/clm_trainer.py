"""A causal-LM fine-tune in the style of transformers' examples/pytorch/language-modeling/run_clm.py: a tiny
GPT-2 built from a config, a local text corpus, HfArgumentParser's TrainingArguments with `--deepspeed ds.json`.
Written for DeepSpeed's launcher and run unchanged by `zeroshard-run` (tests/ds_compat.sh): nothing in it
knows about ZeroShard."""
import json
import os
import sys
from dataclasses import dataclass, field

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, HfArgumentParser, Seq2SeqTrainingArguments, Trainer,
                          TrainerCallback, set_seed)
from transformers.trainer_utils import get_last_checkpoint


@dataclass
class DataArguments:
    block_size: int = field(default=32)
    n_blocks: int = field(default=96)
    n_layer: int = field(default=2)
    seq2seq: bool = field(default=False, metadata={"help": "train with Seq2SeqTrainer (a Trainer subclass)"})
    crash_save: str = field(default="", metadata={"help": "test hook, first attempt only: RANK:STEP dies halfway "
                                                           "through the engine's save of STEP (ZS_TEST_CKPT_CRASH)"})
    step_time: float = field(default=0.0, metadata={"help": "a sleep per optimizer step (a test kills a rank "
                                                            "at a step of its choosing)"})


class _Slow(TrainerCallback):
    def __init__(self, seconds):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        import time
        time.sleep(self.seconds)


def corpus(n, block, seed=0):
    """Byte-level 'text': a fixed pseudo-random mix of a few phrases, the same on every run and rank."""
    g = torch.Generator().manual_seed(seed)
    words = [b"the ", b"shard ", b"gathers ", b"a ", b"unit ", b"of ", b"zero ", b"rank ", b"steps ", b"."]
    text = b"".join(words[int(i)] for i in torch.randint(0, len(words), (n * block,), generator=g))
    ids = torch.tensor(list(text[: n * block]), dtype=torch.long).view(n, block)
    return [{"input_ids": r, "labels": r.clone(), "attention_mask": torch.ones_like(r)} for r in ids]


def main():
    # Seq2SeqTrainingArguments: TrainingArguments with the generation fields Seq2SeqTrainer reads
    parser = HfArgumentParser((DataArguments, Seq2SeqTrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)
    if data_args.crash_save and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        os.environ["ZS_TEST_CKPT_CRASH"] = data_args.crash_save
    config = GPT2Config(vocab_size=256, n_positions=data_args.block_size, n_embd=64, n_layer=data_args.n_layer,
                        n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)   # under ZeRO-3 the Trainer's args have set up zero.Init for this
    train = corpus(data_args.n_blocks, data_args.block_size)
    evals = corpus(16, data_args.block_size, seed=1)
    cls = Trainer
    if data_args.seq2seq:   # a subclass of the Trainer, as Seq2SeqTrainer, TRL's and others' trainers are
        from transformers import Seq2SeqTrainer as cls
    trainer = cls(model=model, args=training_args, train_dataset=train,
                  eval_dataset=evals if training_args.do_eval else None)
    last = training_args.resume_from_checkpoint
    out = training_args.output_dir
    if last is None and os.path.isdir(out) and not getattr(training_args, "overwrite_output_dir", False):
        last = get_last_checkpoint(out)   # run_clm.py's: a run started again continues from its newest checkpoint
    if data_args.step_time:
        trainer.add_callback(_Slow(data_args.step_time))
    result = trainer.train(resume_from_checkpoint=last)
    trainer.save_model()
    metrics = result.metrics
    if training_args.do_eval:
        metrics.update(trainer.evaluate())
    if trainer.is_world_process_zero():
        with open(os.path.join(training_args.output_dir, "losses.json"), "w") as f:
            json.dump({"log": trainer.state.log_history, "world": int(os.environ.get("WORLD_SIZE", 1)),
                       "rank_env": os.environ.get("RANK"), "trainer": type(trainer).__name__}, f)
    print(f"clm_trainer: done, {len(trainer.state.log_history)} log entries", file=sys.stderr)


if __name__ == "__main__":
    main()

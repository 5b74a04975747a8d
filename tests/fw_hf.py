"""fw_hf.py MODE DIR - checks what fw_hf.sh's runs of examples/pytorch/fortunes_hf.py left in DIR (RESULT files
NAME.json, the --save-dir folders); prints what it found, exits 1 on a mismatch.

  parity  trainer.json (the plain Trainer) against stage1.json and stage3.json (its DeepSpeed integration on
          ZeroShard): losses within LOSS_TOL at every step, the short window at the epoch's end included;
          accuracy above the majority class
  ckpt    resumed.json (resume_from_checkpoint checkpoint-10, stage 3) ends on full.json's losses and
          params-hash bit for bit; the save_model folder holds the files the Trainer writes and from_pretrained
          loads the trained parameters bit for bit
  config  absent.json (no gradient_clipping in the config, max_grad_norm 0) trains as clip1.json ("auto" filled
          with 1.0: DeepSpeed 0.19.8's default when the key is absent) and not as clip0.json (max_grad_norm 0)
  cuda    cuda3.json (stage 3, `zeroshard.device: "cuda"` over the CUDA emulator's library) has cpu3.json's
          losses and params-hash bit for bit
"""
import os
import sys

from fw_checks import Checks

# the plain Trainer (DDP over gloo) against ZeroShard: the ranks' reduction and the accumulation round
# differently; measured at most 2.4e-7 apart on these 20 steps (losses near 2.77)
LOSS_TOL = 1e-5
C = Checks("fw_hf")


def mode_parity(d):
    C.parity(d, "trainer", "the plain Trainer", LOSS_TOL, note=lambda r, ref: (
        f" (step 15 the epoch's short window: {r['losses'][14]:.4f} against {ref['losses'][14]:.4f})"))


def mode_cuda(d):
    C.identical(d, "cpu3", "cuda3", "zeroshard.device \"cuda\" (the emulated GPU)", "zeroshard.device \"cpu\"")


def mode_ckpt(d):
    full = C.resumed(d, "resume_from_checkpoint(checkpoint-10)")
    out = os.path.join(d, "run")
    missing = [f for f in ("config.json", "model.safetensors", "training_args.bin") if not os.path.exists(
        os.path.join(out, f))]
    if missing:
        C.fail(f"save_model's folder lacks {missing}: it holds {sorted(os.listdir(out))}")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "pytorch"))
    import fortunes
    from transformers import AutoModelForSequenceClassification
    back = AutoModelForSequenceClassification.from_pretrained(out)
    h = fortunes.params_hash(back.named_parameters())
    if h != full["params_hash"]:
        C.fail(f"from_pretrained(save_model's folder) has params-hash {h}, the trained model {full['params_hash']}")
    else:
        print(f"fw_hf ckpt: save_model wrote {sorted(f for f in os.listdir(out) if '.' in f)}; from_pretrained "
              f"gives the trained parameters (params {h})")


def mode_config(d):
    absent, clip0, clip1 = C.load(d, "absent"), C.load(d, "clip0"), C.load(d, "clip1")
    C.clipping_bites(clip1, clip0)
    if absent["params_hash"] != clip1["params_hash"]:
        C.fail(f"no gradient_clipping in the config: params {absent['params_hash']}, not the run clipped at 1.0 "
               f"(DeepSpeed's default): {clip1['params_hash']} (the unclipped run's is {clip0['params_hash']})")
    else:
        print(f"fw_hf config: no gradient_clipping in the config clips at 1.0, DeepSpeed's default, with "
              f"max_grad_norm 0 (params {absent['params_hash']}; unclipped: {clip0['params_hash']})")


if __name__ == "__main__":
    C.run({"parity": mode_parity, "ckpt": mode_ckpt, "config": mode_config, "cuda": mode_cuda})

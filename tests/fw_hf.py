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
"""
import json
import os
import sys

# the plain Trainer (DDP over gloo) against ZeroShard: the ranks' reduction and the accumulation round
# differently; measured at most 2.4e-7 apart on these 20 steps (losses near 2.77)
LOSS_TOL = 1e-5
MAJORITY = 0.5404   # the test split's larger class
FAILED = []


def fail(msg):
    FAILED.append(msg)
    print(f"fw_hf: FAIL: {msg}", flush=True)


def load(d, name):
    with open(os.path.join(d, f"{name}.json")) as f:
        return json.load(f)


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")


def mode_parity(d):
    ref = load(d, "trainer")
    for name in ("stage1", "stage3"):
        r = load(d, name)
        diff = max_diff(r["losses"], ref["losses"])
        if diff > LOSS_TOL:
            fail(f"{name}: losses {r['losses']} against the Trainer's {ref['losses']} (max diff {diff:.2e})")
        if r["test_acc"] is None or r["test_acc"] <= MAJORITY:
            fail(f"{name}: test accuracy {r['test_acc']} is not above the majority class {MAJORITY}")
        print(f"fw_hf parity: {name}: {len(r['losses'])} losses within {diff:.1e} of the plain Trainer's "
              f"(step 15 the epoch's short window: {r['losses'][14]:.4f} against {ref['losses'][14]:.4f}), "
              f"accuracy {r['test_acc']:.3f}")


def mode_ckpt(d):
    full, resumed = load(d, "full"), load(d, "resumed")
    if resumed["params_hash"] != full["params_hash"] or resumed["losses"] != full["losses"]:
        fail(f"resumed at step 10: params {resumed['params_hash']} losses {resumed['losses'][10:]}; "
             f"uninterrupted: params {full['params_hash']} losses {full['losses'][10:]}")
    else:
        print(f"fw_hf ckpt: resume_from_checkpoint(checkpoint-10) ends bit for bit (params {full['params_hash']})")
    out = os.path.join(d, "run")
    missing = [f for f in ("config.json", "model.safetensors", "training_args.bin") if not os.path.exists(
        os.path.join(out, f))]
    if missing:
        fail(f"save_model's folder lacks {missing}: it holds {sorted(os.listdir(out))}")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "pytorch"))
    import fortunes
    from transformers import AutoModelForSequenceClassification
    back = AutoModelForSequenceClassification.from_pretrained(out)
    h = fortunes.params_hash(back.named_parameters())
    if h != full["params_hash"]:
        fail(f"from_pretrained(save_model's folder) has params-hash {h}, the trained model {full['params_hash']}")
    else:
        print(f"fw_hf ckpt: save_model wrote {sorted(f for f in os.listdir(out) if '.' in f)}; from_pretrained "
              f"gives the trained parameters (params {h})")


def mode_config(d):
    absent, clip0, clip1 = load(d, "absent"), load(d, "clip0"), load(d, "clip1")
    if clip0["losses"] == clip1["losses"]:
        fail("clipping at 1.0 does not change the losses: the check cannot tell clipping from none")
    if absent["params_hash"] != clip1["params_hash"]:
        fail(f"no gradient_clipping in the config: params {absent['params_hash']}, not the run clipped at 1.0 "
             f"(DeepSpeed's default): {clip1['params_hash']} (the unclipped run's is {clip0['params_hash']})")
    else:
        print(f"fw_hf config: no gradient_clipping in the config clips at 1.0, DeepSpeed's default, with "
              f"max_grad_norm 0 (params {absent['params_hash']}; unclipped: {clip0['params_hash']})")


if __name__ == "__main__":
    {"parity": mode_parity, "ckpt": mode_ckpt, "config": mode_config}[sys.argv[1]](sys.argv[2])
    print(f"fw_hf {sys.argv[1]}: {'FAILED' if FAILED else 'passed'}")
    sys.exit(1 if FAILED else 0)

"""fortunes.py - the task the framework examples share: which of two Debian `fortunes` files a fortune comes
from (default `computers` against `people`), classified by a DistilBERT built from a DistilBertConfig over a
word vocabulary counted on the training split (no download, no tokenizer library).

The split is fixed by a hash of each fortune's text (one in five held out for the test), the vocabulary by
counts on the training split (ties by the word), so every process and every run sees the same data. Each
script (fortunes_lightning.py, fortunes_fabric.py, fortunes_accelerate.py, fortunes_hf.py) adds its framework's loop on top and
prints one JSON line at the end (see `result`).
"""
import argparse
import collections
import hashlib
import json
import os
import re
import resource
import zlib

CORPUS = "/usr/share/games/fortunes"
SPECIALS = ["[PAD]", "[CLS]", "[UNK]"]
PAD, CLS, UNK = 0, 1, 2
_WORD = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")


def add_args(p, steps=200):
    """The flags every framework script takes (it adds --strategy with its own choices)."""
    p.add_argument("--steps", type=int, default=steps, help="optimizer steps")
    p.add_argument("--micro-batch", type=int, default=16, help="fortunes per rank per micro-batch")
    p.add_argument("--accum", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=10, help="linear warm-up steps (then linear decay to 0)")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping (max global norm; 0: none)")
    p.add_argument("--precision", default="32-true", help="32-true, bf16-mixed, ...")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64, help="tokens per fortune ([CLS] first; longer ones cut)")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--classes", default="computers,people", help="two fortunes files: label 0, label 1")
    p.add_argument("--data", default=CORPUS, help="the directory holding the fortunes files")
    p.add_argument("--init", help="safetensors file of DistilBERT weights (Hugging Face names) to start from")
    p.add_argument("--lora", action="store_true", help="freeze the model and train peft LoRA adapters")
    p.add_argument("--save-dir", help="checkpoint directory (the framework's own checkpoint)")
    p.add_argument("--save-at", type=int, default=0, help="save a checkpoint after this step (0: only at the end)")
    p.add_argument("--resume", action="store_true", help="resume from the checkpoint in --save-dir")
    p.add_argument("--metrics", help="append one JSON line per step (step, loss) to this file (rank 0)")
    p.add_argument("--result", help="also write the final JSON line to this file (rank 0)")
    p.add_argument("--no-eval", action="store_true", help="skip the test-split accuracy")
    return p


def parser(doc, steps=200):
    return add_args(argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                            formatter_class=argparse.RawDescriptionHelpFormatter), steps)


def read_fortunes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return [t.strip() for t in re.split(r"^%$", text, flags=re.M) if t.strip()]


def words(text):
    return _WORD.findall(text.lower())


def load_task(a):
    """(train, test, vocab): train/test lists of (text, label); vocab word -> id."""
    names = a.classes.split(",")
    if len(names) != 2:
        raise SystemExit(f"fortunes: --classes takes two fortunes files, got {a.classes!r}")
    train, test = [], []
    for label, name in enumerate(names):
        for t in read_fortunes(os.path.join(a.data, name)):
            (test if zlib.crc32(t.encode()) % 5 == 0 else train).append((t, label))
    counts = collections.Counter(w for t, _ in train for w in words(t))
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:a.vocab - len(SPECIALS)]
    vocab = {w: i for i, w in enumerate(SPECIALS + [w for w, _ in top])}
    return train, test, vocab


def encode(text, vocab, seq):
    ids = [CLS] + [vocab.get(w, UNK) for w in words(text)][:seq - 1]
    return ids + [PAD] * (seq - len(ids)), [1] * len(ids) + [0] * (seq - len(ids))


class Fortunes:
    """A map-style dataset of dicts (input_ids, attention_mask, labels): what Hugging Face models take as
    keyword arguments, and what the Trainer's and Accelerate's default collation stacks."""

    def __init__(self, rows, vocab, seq):
        import torch
        enc = [encode(t, vocab, seq) for t, _ in rows]
        self.ids = torch.tensor([e[0] for e in enc], dtype=torch.long)
        self.mask = torch.tensor([e[1] for e in enc], dtype=torch.long)
        self.labels = torch.tensor([lbl for _, lbl in rows], dtype=torch.long)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def datasets(a):
    train, test, vocab = load_task(a)
    return Fortunes(train, vocab, a.seq), Fortunes(test, vocab, a.seq), vocab


def build_model(a, vocab_size):
    """DistilBERT for two-way classification from its config (dropout 0: every strategy draws the same
    numbers); --init loads weights first, --lora wraps it in peft's adapters (the base frozen)."""
    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    torch.manual_seed(a.seed)
    model = DistilBertForSequenceClassification(DistilBertConfig(
        vocab_size=vocab_size, dim=a.dim, n_layers=a.layers, n_heads=a.heads, hidden_dim=4 * a.dim,
        max_position_embeddings=a.seq, dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0,
        num_labels=2))
    if a.init:
        from safetensors.torch import load_file
        model.load_state_dict(load_file(a.init), strict=False)
    if a.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="SEQ_CLS",
                                                 target_modules=["q_lin", "v_lin"]))
    return model


def decay_groups(model, weight_decay):
    """The Hugging Face Trainer's rule: no weight decay for biases and LayerNorm weights; frozen tensors out."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    no_decay = lambda n: n.endswith(".bias") or "layer_norm" in n.lower() or "LayerNorm" in n  # noqa: E731
    return [{"params": [p for n, p in named if not no_decay(n)], "weight_decay": weight_decay},
            {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}]


def linear_warmup(optimizer, a):
    """transformers.get_linear_schedule_with_warmup over --steps (what the Trainer builds by default)."""
    from transformers import get_linear_schedule_with_warmup
    return get_linear_schedule_with_warmup(optimizer, a.warmup, a.steps)


def params_hash(named):
    """sha256 (16 hex digits) of (name, fp32 bytes) over a full state's tensors in the order given."""
    import torch
    h = hashlib.sha256()
    for name, t in named:
        h.update(name.encode())
        h.update(t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def mpi_to_torch_env():
    """For the frameworks' own strategies under mpirun: torch.distributed's variables (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) from Open MPI's, unless set. The port comes from
    the job id, so every rank of one job picks the same one."""
    env = os.environ
    if "OMPI_COMM_WORLD_SIZE" not in env:
        return
    env.setdefault("RANK", env["OMPI_COMM_WORLD_RANK"])
    env.setdefault("WORLD_SIZE", env["OMPI_COMM_WORLD_SIZE"])
    env.setdefault("LOCAL_RANK", env["OMPI_COMM_WORLD_LOCAL_RANK"])
    env.setdefault("LOCAL_WORLD_SIZE", env["OMPI_COMM_WORLD_LOCAL_SIZE"])
    # the node's index (Open MPI's OMPI_COMM_WORLD_NODE_RANK is the rank within the node, not this)
    env.setdefault("NODE_RANK", str(int(env["OMPI_COMM_WORLD_RANK"]) // int(env["OMPI_COMM_WORLD_LOCAL_SIZE"])))
    uri = env.get("OMPI_MCA_orte_hnp_uri", "")
    m = re.search(r"tcp://([0-9.]+):", uri)
    env.setdefault("MASTER_ADDR", m.group(1) if m else "127.0.0.1")
    job = int(env.get("OMPI_MCA_ess_base_jobid", "0") or 0)
    env.setdefault("MASTER_PORT", str(20000 + (job >> 16) % 20000))


def result(a, script, strategy, world, train_s, test_acc, rss_per_rank, phash, losses):
    """The final JSON line (rank 0 calls it): what bench/fortunes_table.py and the tests read."""
    row = {"script": script, "strategy": strategy, "world": world, "steps": a.steps,
           "train_s": round(train_s, 3), "test_acc": test_acc,
           "peak_rss_mib": [round(r, 1) for r in rss_per_rank], "params_hash": phash,
           "losses": [float(x) for x in losses]}
    line = json.dumps(row)
    print("RESULT " + line, flush=True)
    if a.result:
        with open(a.result, "w") as f:
            f.write(line + "\n")
    return row


def log_step(a, step, loss):
    if a.metrics:
        with open(a.metrics, "a") as f:
            f.write(json.dumps({"step": step, "loss": float(loss)}) + "\n")

"""ds_compare.py KIND A B [TOL]: compares what two runs of the same script wrote (tests/ds_compat.sh): the
DeepSpeed run and the zeroshard-run one, or a straight run and a resumed one. Exits 1 naming the first
difference beyond TOL (relative; 0 = bit for bit).
  trainer  A/losses.json B/losses.json: the Trainer's log_history (loss, learning_rate, eval_loss) step by step
  accel    A/log.json B/log.json: per-step losses, the epochs' accuracy and evaluated sample counts
  loop     A/losses*.json B/losses*.json: losses over the steps both ran, and the params hash when TOL is 0
  resumed  A/log.json B/log-resumed.json: the resumed run's losses against the straight run's last ones
"""
import json
import sys


def close(a, b, tol):
    return a == b if tol == 0 else abs(a - b) <= tol * max(abs(a), abs(b), 1e-30)


def fail(msg):
    print(f"ds_compare: FAIL: {msg}")
    sys.exit(1)


def trainer(a, b, tol):
    la, lb = ({e["step"]: e for e in x["log"] if "step" in e} for x in (a, b))
    common = sorted(set(la) & set(lb))
    n = worst = 0
    for s in common:
        for k in ("loss", "learning_rate", "eval_loss"):
            if k in la[s] or k in lb[s]:
                if k not in la[s] or k not in lb[s]:
                    fail(f"step {s}: '{k}' logged by one run only")
                t = tol if k != "learning_rate" else 1e-12   # the same schedule: equal but for rounding
                if not close(la[s][k], lb[s][k], t):
                    fail(f"step {s}: {k} {la[s][k]!r} against {lb[s][k]!r} (tolerance {t})")
                if k != "learning_rate":
                    worst = max(worst, abs(la[s][k] - lb[s][k]) / max(abs(la[s][k]), 1e-30))
                n += 1
    if n == 0:
        fail("no logged values in common")
    if a.get("world") != b.get("world"):
        fail(f"world sizes {a.get('world')} and {b.get('world')}")
    return f"{n} logged values over steps {common[0]}..{common[-1]}, worst relative difference {worst:.2e}"


def accel(a, b, tol):
    for k in ("num_processes", "deepspeed", "eval_samples", "accuracy"):
        if a[k] != b[k]:
            fail(f"{k}: {a[k]!r} against {b[k]!r}")
    if len(a["loss"]) != len(b["loss"]) or not a["loss"]:
        fail(f"{len(a['loss'])} and {len(b['loss'])} losses")
    worst = 0.0
    for i, (x, y) in enumerate(zip(a["loss"], b["loss"])):
        if not close(x, y, tol):
            fail(f"micro-batch {i + 1}: loss {x!r} against {y!r} (tolerance {tol})")
        worst = max(worst, abs(x - y) / abs(x))
    return (f"{len(a['loss'])} losses, worst relative difference {worst:.2e}; accuracy {a['accuracy']}, "
            f"{a['eval_samples']} samples evaluated, {a['num_processes']} processes")


def loop(a, b, tol):
    off = b["start"] - a["start"]
    la, lb = a["losses"][off:], b["losses"]
    if not lb or len(la) != len(lb):
        fail(f"{len(la)} and {len(lb)} losses to compare")
    worst = 0.0
    for i, (x, y) in enumerate(zip(la, lb)):
        if not close(x, y, tol):
            fail(f"step {b['start'] + i + 1}: loss {x!r} against {y!r} (tolerance {tol})")
        worst = max(worst, abs(x - y) / abs(x))
    if tol == 0 and a["hash"] != b["hash"]:
        fail(f"params hash {a['hash']} against {b['hash']}")
    return f"{len(lb)} losses from step {b['start'] + 1}, worst relative difference {worst:.2e}"


def resumed(a, b, tol):
    la, lb = a["loss"][len(a["loss"]) - len(b["loss"]):], b["loss"]
    if not lb:
        fail("the resumed run logged no loss")
    for i, (x, y) in enumerate(zip(la, lb)):
        if not close(x, y, tol):
            fail(f"resumed micro-batch {i + 1}: loss {x!r} against the straight run's {y!r} (tolerance {tol})")
    if a["accuracy"][-1] != b["accuracy"][-1]:
        fail(f"last accuracy {a['accuracy'][-1]} against {b['accuracy'][-1]}")
    return f"the resumed run's {len(lb)} losses and last accuracy equal the straight run's"


def main():
    kind, pa, pb = sys.argv[1:4]
    tol = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    with open(pa) as f:
        a = json.load(f)
    with open(pb) as f:
        b = json.load(f)
    print(f"ds_compare {kind}: {({'trainer': trainer, 'accel': accel, 'loop': loop, 'resumed': resumed}[kind])(a, b, tol)}")


if __name__ == "__main__":
    main()

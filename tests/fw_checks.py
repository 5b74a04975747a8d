"""fw_checks.py - what tests/fw_hf.py and tests/fw_accelerate.py check alike over the RESULT files their runs of
examples/pytorch/fortunes_*.py leave (NAME.json): a failure list, parity with the plain framework, a resume that
ends bit for bit, and clipping at 1.0 told apart from none."""
import json
import os
import sys

MAJORITY = 0.5404   # the fortunes test split's larger class


class Checks:
    def __init__(self, name):
        self.name, self.failed = name, []

    def fail(self, msg):
        self.failed.append(msg)
        print(f"{self.name}: FAIL: {msg}", flush=True)

    def load(self, d, name):
        with open(os.path.join(d, f"{name}.json")) as f:
            return json.load(f)

    def parity(self, d, ref_name, what, tol, steps=None, note=None):
        """stage1.json and stage3.json against the plain framework's ref_name.json: every loss within tol (as
        many losses, `steps` of them when given), accuracy above the majority class. note(r, ref) adds to the
        line printed."""
        ref = self.load(d, ref_name)
        for name in ("stage1", "stage3"):
            r = self.load(d, name)
            ok = len(r["losses"]) == len(ref["losses"]) and steps in (None, len(r["losses"]))
            diff = max(abs(x - y) for x, y in zip(r["losses"], ref["losses"])) if ok else float("inf")
            if diff > tol:
                self.fail(f"{name}: losses {r['losses']} against {what}'s {ref['losses']} (max diff {diff:.2e})")
            if r["test_acc"] is None or r["test_acc"] <= MAJORITY:
                self.fail(f"{name}: test accuracy {r['test_acc']} is not above the majority class {MAJORITY}")
            print(f"{self.name} parity: {name}: {len(r['losses'])} losses within {diff:.1e} of {what}'s"
                  f"{note(r, ref) if note else ''}, accuracy {r['test_acc']}", flush=True)

    def resumed(self, d, how):
        """resumed.json ends on full.json's losses and params-hash bit for bit. Returns full.json."""
        return self.identical(d, "full", "resumed", how, "uninterrupted")

    def identical(self, d, ref_name, name, how, ref_what):
        """name.json has ref_name.json's losses and params-hash bit for bit. Returns ref_name.json."""
        ref, r = self.load(d, ref_name), self.load(d, name)
        if ref["losses"] != r["losses"] or ref["params_hash"] != r["params_hash"]:
            self.fail(f"{how}: losses {r['losses']}, params-hash {r['params_hash']}; {ref_what}: "
                      f"losses {ref['losses']}, params-hash {ref['params_hash']}")
        else:
            print(f"{self.name}: {how}: the losses and params-hash {ref['params_hash']} bit for bit", flush=True)
        return ref

    def clipping_bites(self, clip1, clip0):
        if clip1["losses"] == clip0["losses"]:
            self.fail("clipping at 1.0 does not change the losses: the check cannot tell clipping from none")

    def run(self, modes):
        modes[sys.argv[1]](sys.argv[2])
        print(f"{self.name} {sys.argv[1]}: {'FAILED' if self.failed else 'passed'}")
        sys.exit(1 if self.failed else 0)

#!/usr/bin/env python3
"""scale_model.py ESTIMATE - zs-estimate --time against values computed by hand from docs/scale.md's
formulas (one GPU: compute and optimizer only; nodes at a given bandwidth: the collective terms; hybrid
and quantized cross-node bytes), the orderings that must hold (more bandwidth is never slower, quantized
crossings carry fewer bytes), and bad options refused naming the flag."""
import json
import subprocess
import sys

EST = sys.argv[1]
failed = []


def run(*args):
    p = subprocess.run([EST, "--time", *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def rows(*args):
    rc, out, err = run("--json", *args)
    if rc:
        raise SystemExit(f"FAIL: {' '.join(args)}: rc {rc}: {err}")
    return {r["gpus"]: r for r in json.loads(out)["time_model"]["rows"]}


def check(ok, what):
    print(("  ok   " if ok else "FAIL   ") + what)
    if not ok:
        failed.append(what)


def near(got, want, what):
    check(abs(got - want) <= 1e-9 * max(abs(want), 1e-12), f"{what}: {got:.9g} (want {want:.9g})")


# no latency; stage 3 re-gathers every unit it uses (nothing kept for reuse) unless a case says otherwise
NOLAT = ["--dtype", "fp32", "--inter-lat", "0", "--intra-lat", "0"]
FP32 = NOLAT + ["--max-reuse", "0"]

# One GPU: compute = 6 * 1e9 * 1000 tokens / 1e12 FLOP/s = 6 s; AdamW fp32 moves 28 bytes a parameter:
# 28e9 B / 1000 GB/s = 0.028 s; nothing to communicate.
one = ["--params", "1e9", "--seq", "1000", "--flops", "1e12", "--mem-bw", "1000", "--gpus", "1"] + FP32
r = rows(*one)[1]
near(r["compute_s"], 6, "one GPU: compute")
near(r["optimizer_s"], 0.028, "one GPU: optimizer")
near(r["comm_total_s"], 0, "one GPU: communication")
near(r["step_s"], 6.028, "one GPU: step")
near(rows(*one, "--recompute")[1]["compute_s"], 8, "one GPU, recomputation: compute x 4/3")
# Two ranks sharing one core: each computes at half the rate.
near(rows(*one[:-2], "--gpus", "2", "--cores", "1")[2]["compute_s"], 12, "two ranks on one core: compute")

# Two nodes of one rank, 1 GB/s between them, 1e6 fp32 parameters (S = 4e6 B), no overlap: stage 2:
# reduce-scatter 1/2 * S / 1e9 = 2 ms, the gather after the step 2 ms; stage 3: two gathers and a
# reduce-scatter, 6 ms; every byte crosses.
TWO = ["--params", "1e6", "--gpus", "2", "--ranks-per-node", "1", "--inter-bw", "1", "--intra-bw", "1000",
       "--flops", "1e20", "--overlap", "0"]
two = TWO + FP32
r = rows(*two, "--stage", "2")[2]
near(r["comm_exposed_s"], 0.004, "two nodes, stage 2: communication")
near(r["cross_node_bytes"], 4e6, "two nodes, stage 2: bytes out of a node")
near(rows(*two, "--stage", "3")[2]["comm_exposed_s"], 0.006, "two nodes, stage 3: communication")
# reuse: a unit released at most stage3_max_reuse_distance elements before its next use stays gathered;
# its distance is twice the elements after it, so a reuse distance of P keeps the last half of the model
# into backward (1 ms instead of 2), the default (1e9) all of it; stage3_max_live_parameters caps what stays
r3 = TWO + NOLAT + ["--stage", "3"]
near(rows(*r3, "--max-reuse", "1e6")[2]["comm_exposed_s"], 0.005, "two nodes, stage 3, reuse distance 1e6")
near(rows(*r3)[2]["comm_exposed_s"], 0.004, "two nodes, stage 3, default reuse: no backward gather")
near(rows(*r3, "--max-live", "0")[2]["comm_exposed_s"], 0.006, "two nodes, stage 3, max live 0: nothing kept")
# ... and across micro-batches of a step: only the first forward gathers, every backward reduce-scatters
near(rows(*r3, "--gas", "3")[2]["comm_exposed_s"], 0.002 + 3 * 0.002, "two nodes, stage 3, default reuse, 3 micro")
# stage 0's all-reduce: 2 * (n-1) ring steps of 250 us, plus 2 * 1/2 * S / 1 GB/s
near(rows(*two, "--stage", "0", "--inter-lat", "250")[2]["comm_exposed_s"], 0.0045,
     "two nodes, stage 0: all-reduce with latency")
# ... paid once per unit: --mlp 64,3 has 4 units, so 4 all-reduces of 2 ring steps
SM = 4 * ((16 + 1) * 64 + 2 * (64 + 1) * 64 + (64 + 1) * 4)
r = rows("--mlp", "64,3", *two[2:], "--stage", "0", "--inter-lat", "250")[2]
near(r["comm_exposed_s"], 4 * 2 * 250e-6 + SM / 1e9, "two nodes, stage 0, 4 units: a latency per unit")
# ... and a unit kept gathered for reuse issues no collective: stage 3 at the default reuse distance pays
# the forward's gathers and the reduce-scatters only
r = rows("--mlp", "64,3", *TWO[2:], *NOLAT, "--stage", "3", "--inter-lat", "250")[2]
near(r["comm_exposed_s"], 2 * (4 * 250e-6 + SM / 2 / 1e9), "two nodes, stage 3, 4 units kept: no backward latency")
# stage 2 reduce-scatters every micro-batch and gathers once a step: 3 * 2 + 2 ms
near(rows(*two, "--stage", "2", "--gas", "3")[2]["comm_exposed_s"], 0.008, "two nodes, stage 2, 3 micro-batches")

# Overlap: --mlp 64,3 has 4 units; compute far longer than communication: only the first unit's share of
# each phase waits, (2 + 2 + 2 gathers/reduce-scatter of 1/2 S) / 4 at stage 3.
S = 4 * ((16 + 1) * 64 + 2 * (64 + 1) * 64 + (64 + 1) * 4)
r = rows("--mlp", "64,3", "--gpus", "2", "--ranks-per-node", "1", "--inter-bw", "1", "--flops", "1",
         "--stage", "3", "--overlap", "1", *FP32)[2]
near(r["comm_exposed_s"], 3 * 0.5 * S / 1e9 / 4, "overlap: only the first unit of each phase waits")
# ... and with (almost) no compute to hide behind, all of it is exposed
r = rows("--mlp", "64,3", "--gpus", "2", "--ranks-per-node", "1", "--inter-bw", "1", "--flops", "1e20",
         "--stage", "3", "--overlap", "1", *FP32)[2]
near(r["comm_exposed_s"], 3 * 0.5 * S / 1e9, "overlap: nothing to hide behind, all exposed")

# Four GPUs on two nodes, 1 GB/s inside and across: flat stage 3 moves 3/4 S per collective across
# (3 x 3 ms, 9e6 B); mics_shard_size 2 keeps gathers and reduce-scatter in the node (3 x 2 ms) and adds the
# cross-group all-reduce of each rank's half: 2 ranks x 2 * 1/2 * S/2 = 4e6 B out of a node, 4 ms.
four = ["--params", "1e6", "--gpus", "4", "--ranks-per-node", "2", "--inter-bw", "1", "--intra-bw", "1",
        "--flops", "1e20", "--overlap", "0", "--stage", "3"] + FP32
flat = rows(*four)[4]
near(flat["comm_exposed_s"], 0.009, "4 GPUs flat: communication")
near(flat["cross_node_bytes"], 9e6, "4 GPUs flat: bytes out of a node")
r = rows(*four, "--mics", "2")[4]
near(r["comm_exposed_s"], 0.010, "4 GPUs, mics 2: communication")
near(r["cross_node_bytes"], 4e6, "4 GPUs, mics 2: bytes out of a node")
r = rows(*four, "--hpz", "2")[4]  # the backward's gather stays in the node: 3 + 2 + 3 ms
near(r["comm_exposed_s"], 0.008, "4 GPUs, hpz 2: communication")
near(r["cross_node_bytes"], 6e6, "4 GPUs, hpz 2: bytes out of a node")
# int8 both ways: every crossing carries (1 + 4/256) bytes an element instead of 4 (fp32) or 2 (bf16)
q = rows(*four, "--quant-weights", "--quant-grads")[4]
near(q["cross_node_bytes"], 9e6 * (1 + 4 / 256) / 4, "4 GPUs, int8: bytes out of a node (a quarter of fp32)")
check(q["cross_node_bytes"] < flat["cross_node_bytes"], "quantized crossings smaller than unquantized")
qb = rows(*four, "--quant-weights", "--quant-grads", "--dtype", "bf16")[4]
near(qb["cross_node_bytes"], 9e6 / 2 * (1 + 4 / 256) / 2, "4 GPUs, bf16 int8: bytes out of a node (half)")

# Orderings over 1..1024 GPUs of a GPT: more bandwidth (inside or across) or FLOP/s never slower;
# quantizing never slower and never more bytes across.
GPT = ["--gpt", "24,2048,2048", "--dtype", "bf16", "--micro-batch", "2", "--gas", "2"]


def never_slower(what, slow, fast, key="step_s"):
    a, b = rows(*GPT, *slow), rows(*GPT, *fast)
    ok = len(a) == 11 and a.keys() == b.keys() and all(b[n][key] <= a[n][key] for n in a)
    check(ok, f"{what}: never more {key}")


for s in ["0", "1", "2", "3"]:
    st = ["--stage", s]
    never_slower(f"stage {s}, inter-node 12.5 -> 50 GB/s", st + ["--inter-bw", "12.5"], st + ["--inter-bw", "50"])
    never_slower(f"stage {s}, inter-node 50 -> 400 GB/s", st + ["--inter-bw", "50"], st + ["--inter-bw", "400"])
    never_slower(f"stage {s}, intra-node 100 -> 360 GB/s", st + ["--intra-bw", "100"], st + ["--intra-bw", "360"])
never_slower("stage 3, 1e14 -> 4e14 FLOP/s", ["--flops", "1e14"], ["--flops", "4e14"])
# (int8 gradients with mics_shard_size are refused by the engine, so by the model too: row_refused below)
for key in ["step_s", "cross_node_bytes"]:
    never_slower("stage 3 at 12.5 GB/s, int8 weights and gradients", ["--inter-bw", "12.5"],
                 ["--inter-bw", "12.5", "--quant-weights", "--quant-grads"], key)


def refused(want, *args):
    rc, out, err = run(*args)
    first = (err.splitlines() or [""])[0]
    check(rc == 2 and want in first, f"{' '.join(args)}: exit {rc}, {first!r} names {want}")


refused("--inter-bw", "--params", "1e9", "--inter-bw", "-1")
refused("--intra-bw", "--params", "1e9", "--intra-bw", "0")
refused("--flops", "--params", "1e9", "--flops", "x")
refused("--stage", "--params", "1e9", "--stage", "4")
refused("--gpus", "--params", "1e9", "--gpus", "4,0")
refused("--gpt", "--gpt", "0,512,128")
refused("--hpz", "--params", "1e9", "--stage", "2", "--hpz", "8")
refused("--quant-weights", "--params", "1e9", "--stage", "2", "--quant-weights")
refused("--frobnicate", "--params", "1e9", "--frobnicate", "3")
refused("needs a model", "--stage", "3")
rc, out, err = run("--params", "1e9", "--mics", "3", "--gpus", "6,8", "--ranks-per-node", "1", "--json")
j = json.loads(out)["time_model"]["rows"] if rc == 0 else []
check(len(j) == 2 and "step_s" in j[0] and "mics_shard_size 3 does not divide the world size 8" in j[1].get("refused", ""),
      f"mics 3: runs at 6 GPUs, refused at 8 naming mics_shard_size: {j}")

# What the engine refuses at a GPU count is a refused row naming the key (the engine's own check, core/plan.h's
# zs_layout_check), not a priced one: a shard group above the world, quantized gradients below stage 2,
# quantization with hybrid sharding, hpZ above the shard group (equal to it: off, as the engine takes it).
def row_refused(want, gpus, *args):
    rc, out, err = run("--params", "1e9", "--gpus", ",".join(map(str, gpus)), "--json", *args)
    j = json.loads(out)["time_model"]["rows"] if rc == 0 else []
    got = [("refused" in r and want in r["refused"]) if w else "step_s" in r for r, w in zip(j, gpus.values())]
    check(rc == 0 and len(j) == len(gpus) and all(got), f"{' '.join(args)}: refused at {[g for g, w in gpus.items() if w]} "
          f"naming {want!r}, priced elsewhere: {j}")


row_refused("mics_shard_size 8 does not divide the world size 4", {4: True, 16: False}, "--mics", "8")
row_refused("zero_quantized_gradients", {16: True}, "--stage", "1", "--quant-grads")
row_refused("zero_quantized_gradients", {16: True}, "--stage", "0", "--quant-grads")
row_refused("zero_quantized_weights: not implemented with hybrid sharding", {16: True}, "--mics", "8", "--quant-weights")
row_refused("zero_quantized_gradients: not implemented with hybrid sharding", {16: True}, "--stage", "2", "--mics", "8",
            "--quant-grads")
row_refused("zero_hpz_partition_size 16 does not divide the shard group's size 8", {16: True}, "--mics", "8",
            "--hpz", "16")
row_refused("", {16: False}, "--mics", "8", "--hpz", "8")
rc, out, err = run("--params", "1e9", "--mics", "8", "--gpus", "4,16")
check(rc == 0 and any(l.split()[:2] == ["4", "refused:"] and "mics_shard_size 8" in l for l in out.splitlines()),
      f"text: a 'refused:' row at 4 GPUs naming mics_shard_size: {out!r}")

print(f"scale_model: {len(failed)} failed")
sys.exit(1 if failed else 0)

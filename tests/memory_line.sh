#!/usr/bin/env bash
# memory_line.sh TRAIN - the start-up memory line against the ZeRO formulas (fp32 + AdamW: parameters 4,
# gradients 4, optimizer 8 bytes a parameter, sharded by 2 at stage 3): each category's formula is
# printed as its own (the optimizer's is twice the parameters'), and with both offloads on NVMe the
# parameters and optimizer state on disk are shown and counted in the ratio, which stays near 1.
set -u
TRAIN=$1
source "$(dirname "$0")/lib.sh"
nvme=$tmp/nvme
mkdir -p "$nvme"
cfg() { # name offload
  cat > "$tmp/$1.json" <<JSON
{"train_batch_size": 8, "steps_per_print": 0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "aio": {"block_size": 4096},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0 $2}}
JSON
}
cfg ram ''
cfg nvme ', "offload_optimizer": {"device": "nvme", "nvme_path": "'"$nvme"'"},
            "offload_param": {"device": "nvme", "nvme_path": "'"$nvme"'"}'

# prints "params RAM DISK FORMULA RATIO optimizer RAM DISK FORMULA RATIO" (MiB; DISK 0 when not shown)
parse() {
  python3 -c '
import re, sys
line = sys.argv[1]
out = []
for what in ("params", "optimizer"):
    m = re.search(what + r" ([0-9.]+) MiB(?: \+ ([0-9.]+) MiB on NVMe)?(?: \(fp32 masters [0-9.]+ MiB\))? \[([0-9.]+) MiB ([0-9.]+)\]", line)
    if not m:
        sys.exit("no " + what + " figure in: " + line)
    out += [what, m.group(1), m.group(2) or "0", m.group(3), m.group(4)]
print(" ".join(out))' "$1"
}

for v in ram nvme; do
  out=$(timeout 120 mpirun --oversubscribe -np 2 "$TRAIN" --config "$tmp/$v.json" --steps 1 --hidden 512 --layers 4 \
        2>&1) || run_failed "$v: $(echo "$out" | grep -m1 'error:')"
  line=$(echo "$out" | grep -m1 "memory per rank")
  echo "$v: $line"
  fig=$(parse "$line") || { check bad "$v: $fig"; continue; }
  echo "$v: $fig"
  read -r _ pram pdisk pform pratio _ oram odisk oform oratio <<< "$fig"
  verdict=$(python3 -c '
import sys
v, pram, pdisk, pform, pratio, oram, odisk, oform, oratio = sys.argv[1], *map(float, sys.argv[2:])
bad = []
if abs(oform - 2 * pform) > 0.02: bad.append(f"optimizer formula {oform} is not twice the parameters {pform}")
for what, r in (("params", pratio), ("optimizer", oratio)):
    if not 0.99 <= r <= 1.10: bad.append(f"{what} ratio {r} outside 0.99..1.10")
if v == "nvme" and (pdisk <= 0 or odisk <= 0): bad.append("NVMe share of params or optimizer not shown")
if v == "nvme" and oram > 0.01: bad.append(f"optimizer {oram} MiB in RAM with it on NVMe")
print("; ".join(bad) or "ok")' "$v" "$pram" "$pdisk" "$pform" "$pratio" "$oram" "$odisk" "$oform" "$oratio")
  echo "$v: $verdict"
  [ "$verdict" = ok ] && r=ok || r=bad
  check $r "$v: $verdict"
done
finish memory_line

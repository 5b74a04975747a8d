#!/usr/bin/env bash
# comm_ab.sh BASE_ZS_BENCH NEW_ZS_BENCH [ROUNDS] [NP] - two builds' collectives side by side: zs-bench comm
# (shared memory, NP ranks, 1 KiB and 64 KiB, 300 iterations) run alternately ROUNDS times; per operation
# and size the median over rounds of each run's median latency, with min..max, and the ratio new/base.
# Prints a table and one JSON line per row. The machine is shared: read ratios within a few percent as noise.
set -eu
BASE=$1 NEW=$2 ROUNDS=${3:-7} NP=${4:-2}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$ROUNDS"); do
  for v in base new; do
    b=$BASE; [ $v = new ] && b=$NEW
    mpirun --oversubscribe -np "$NP" "$b" comm --sizes 1K,64K --iters 300 2>/dev/null |
      grep '"impl": "zeroshard"' | sed "s/^/$v /" >> "$out"
  done
done
python3 - "$out" <<'PY'
import collections, json, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    v, js = line.split(' ', 1)
    r = json.loads(js)
    d[(r['op'], r['bytes'], v)].append(r['time_us_median'])
for op, b in sorted({(k[0], k[1]) for k in d}):
    a, n = d[(op, b, 'base')], d[(op, b, 'new')]
    ma, mn = statistics.median(a), statistics.median(n)
    print(f"{op:15s} {b:6d} B  base {ma:7.2f} us [{min(a):.2f}..{max(a):.2f}]  new {mn:7.2f} us [{min(n):.2f}..{max(n):.2f}]  new/base {mn / ma:.2f}")
    print(json.dumps({"bench": "comm_ab", "op": op, "bytes": b, "base_us": ma, "new_us": mn, "ratio": mn / ma}))
PY

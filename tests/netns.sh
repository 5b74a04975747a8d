#!/usr/bin/env bash
# netns.sh MLP - two "hosts" as network namespaces on a bridge (netns_lib.sh), one rank each, Open MPI
# launched across them over TCP (a launch agent that enters the namespace, never the loopback shortcut):
# the params-hash equals the one-node run's; with delay and loss added by tc netem it still does; a link
# taken down mid-run ends in a named timeout, not a hang, and nothing is left running. Skips (77) with
# the reason where namespaces cannot be made (no root, no iproute2, a container without the privilege).
set -u
MLP=$1
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns_lib.sh"
trap 'ns_teardown; rm -rf "$tmp"' EXIT
ns_setup 2 1 || { echo "SKIP: $ns_why"; exit 77; }
cat > "$tmp/c.json" <<JSON
{"train_batch_size": 16, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
JSON
two_hosts() { # [-x VAR=V]... then program flags
  local x=(); while [ "${1:-}" = -x ]; do x+=(-x "$2"); shift 2; done
  NS_LIMIT=${LIMIT:-120} ns_mpirun "${x[@]}" -- "$MLP" --config "$tmp/c.json" --hidden 48 --seed 3 "$@"; }
hash_of() { awk '/^params-hash/ {print $2}' "$1"; }

timeout -k 5 120 mpirun -np 2 "$MLP" --config "$tmp/c.json" --hidden 48 --quiet --seed 3 --steps 40 > "$tmp/one.log" 2>&1 ||
  run_failed "one node: $(tail -3 "$tmp/one.log")"
ref=$(hash_of "$tmp/one.log")
two_hosts --steps 40 > "$tmp/two.log" 2>&1
rc=$?
[ $rc -eq 0 ] || skip "Open MPI could not launch across the namespaces (rc $rc): $(grep -v '^step' "$tmp/two.log" | head -5 | tr '\n' ' ')"
got=$(hash_of "$tmp/two.log")
grep -m1 'collectives:' "$tmp/two.log"
grep -q 'collectives: shm+mpi (2 nodes' "$tmp/two.log" && check ok ||
  check fail "two hosts: the run did not see two nodes: $(grep -m1 'collectives:' "$tmp/two.log")"
echo "one node $ref; two namespaces over TCP $got"
[ -n "$ref" ] && [ "$ref" = "$got" ] && check ok || check fail "two hosts: params-hash $got != $ref"

if ns_qdisc netem delay 3ms 1ms loss 2%; then
  two_hosts --steps 40 > "$tmp/netem.log" 2>&1 || run_failed "netem: $(tail -3 "$tmp/netem.log")"
  got=$(hash_of "$tmp/netem.log")
  echo "with netem delay 3ms +-1ms, loss 2% both ways: $got"
  [ "$ref" = "$got" ] && check ok || check fail "netem: params-hash $got != $ref"
  ns_qdisc none
else
  echo "netem not available here ($ns_why): delay/loss case not run"
fi

# The link goes down mid-run: the rank on each side must give up within ZS_TIMEOUT naming the other.
LIMIT=60 two_hosts -x ZS_TIMEOUT=4 --steps 100000 > "$tmp/down.log" 2>&1 &
job=$!
ns_cut "$tmp/down.log" 20 1
grep -m1 'zeroshard: error' "$tmp/down.log"
if grep -q 'timeout: operation [0-9]* .*did not complete in 4\.[0-9] s.*ranks not arrived: 1' "$tmp/down.log"; then
  echo "link down: named after $ns_cut_s s"
  check ok
else
  check fail "link down: no timeout naming rank 1 within 20 s: $(grep -v '^step' "$tmp/down.log" | head -5)"
fi
# mpirun cannot reach the other side's daemon any more: what it does not end, the namespaces' cleanup does.
ns_reap $job
[ -z "$ns_left" ] && check ok || check fail "link down: processes left in the namespaces: $ns_left"
finish netns

#!/usr/bin/env bash
# netns.sh MLP - two "hosts" as network namespaces joined by a veth pair, Open MPI launched across them
# over TCP (a launch agent that enters the namespace, never the loopback or shared-memory shortcut):
# the params-hash equals the one-node run's; with delay and loss added by tc netem it still does; a link
# taken down mid-run ends in a named timeout, not a hang, and nothing is left running. Skips (77) with
# the reason where namespaces cannot be made (no root, no iproute2, a container without the privilege).
set -u
MLP=$1
. "$(dirname "$0")/lib.sh"
A=zsa$$ B=zsb$$ NET=10.77.$(( $$ % 200 + 20 ))
IPA=$NET.1 IPB=$NET.2

skip() { echo "SKIP: $*"; exit 77; }
command -v ip > /dev/null || skip "no ip (iproute2)"
cleanup() {
  for ns in $A $B; do
    pids=$(ip netns pids $ns 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del $ns 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add $A 2> "$tmp/err" || skip "network namespaces cannot be made here: $(cat "$tmp/err")"
ip netns add $B && ip link add v$A type veth peer name v$B 2> "$tmp/err" || skip "no veth pair: $(cat "$tmp/err")"
ip link set v$A netns $A && ip link set v$B netns $B &&
  ip -n $A addr add $IPA/24 dev v$A && ip -n $B addr add $IPB/24 dev v$B &&
  ip -n $A link set v$A up && ip -n $B link set v$B up && ip -n $A link set lo up && ip -n $B link set lo up ||
  skip "the namespaces' network could not be set up"

# Open MPI's rsh launcher calls AGENT HOST COMMAND...: the agent runs the command inside that host's namespace.
cat > "$tmp/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case \$host in $IPA) ns=$A ;; $IPB) ns=$B ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec \$ns sh -c "\$*"
AGENT
chmod +x "$tmp/agent"
printf '%s slots=1\n%s slots=1\n' $IPA $IPB > "$tmp/hosts"
cat > "$tmp/c.json" <<JSON
{"train_batch_size": 16, "gradient_accumulation_steps": 1, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
JSON
export OMPI_MCA_rmaps_base_oversubscribe=1
two_hosts() { # [-x VAR=V]... then program flags
  local x=(); while [ "${1:-}" = -x ]; do x+=(-x "$2"); shift 2; done
  timeout -k 5 "${LIMIT:-120}" ip netns exec $A mpirun -np 2 --hostfile "$tmp/hosts" --map-by node \
    --mca plm_rsh_agent "$tmp/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include $NET.0/24 --mca btl tcp,self --mca btl_tcp_if_include $NET.0/24 \
    -x PATH -x LD_LIBRARY_PATH "${x[@]}" "$MLP" --config "$tmp/c.json" --hidden 48 --seed 3 "$@"; }
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

ip netns exec $A tc qdisc add dev v$A root netem delay 3ms 1ms loss 2% 2> "$tmp/err" &&
ip netns exec $B tc qdisc add dev v$B root netem delay 3ms 1ms loss 2% 2>> "$tmp/err"
if [ $? -eq 0 ]; then
  two_hosts --steps 40 > "$tmp/netem.log" 2>&1 || run_failed "netem: $(tail -3 "$tmp/netem.log")"
  got=$(hash_of "$tmp/netem.log")
  echo "with netem delay 3ms +-1ms, loss 2% both ways: $got"
  [ "$ref" = "$got" ] && check ok || check fail "netem: params-hash $got != $ref"
  ip netns exec $A tc qdisc del dev v$A root; ip netns exec $B tc qdisc del dev v$B root
else
  echo "netem not available here ($(cat "$tmp/err")): delay/loss case not run"
fi

# The link goes down mid-run: the rank on each side must give up within ZS_TIMEOUT naming the other.
LIMIT=60 two_hosts -x ZS_TIMEOUT=4 --steps 100000 > "$tmp/down.log" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q '^step 20 ' "$tmp/down.log" 2>/dev/null && break; sleep 0.05; done
ip -n $B link set v$B down
t0=$(date +%s)
for _ in $(seq 200); do grep -q 'zeroshard: error' "$tmp/down.log" && break; sleep 0.1; done
t1=$(date +%s)
grep -m1 'zeroshard: error' "$tmp/down.log"
if grep -q 'timeout: operation [0-9]* .*did not complete in 4\.[0-9] s.*ranks not arrived: 1' "$tmp/down.log"; then
  echo "link down: named after $((t1 - t0)) s"
  check ok
else
  check fail "link down: no timeout naming rank 1 within 20 s: $(grep -v '^step' "$tmp/down.log" | head -5)"
fi
# mpirun cannot reach the other side's daemon any more: what it does not end, the namespaces' cleanup does.
kill $job 2>/dev/null
sleep 1
for ns in $A $B; do pids=$(ip netns pids $ns); [ -n "$pids" ] && kill -9 $pids 2>/dev/null; done
wait $job 2>/dev/null
sleep 1
left=$(for ns in $A $B; do ip netns pids $ns; done)
[ -z "$left" ] && check ok || check fail "link down: processes left in the namespaces: $left"
finish netns

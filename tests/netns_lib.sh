# netns_lib.sh - multi-node on one machine (sourced by tests/netns4.sh and bench/netns_scale.sh): NODES
# "hosts" as network namespaces, each with one veth whose peer is enslaved to a Linux bridge in a further
# "switch" namespace (nothing is added to the root namespace's network), and Open MPI launched across them
# over TCP by an rsh agent that enters the host's namespace. Shared memory still works inside a namespace
# (the mount namespace is shared), so each "host" is a node of SLOTS ranks: shared memory inside, TCP
# between. Each host also gets its own hostname (a UTS namespace): Open MPI names its shared-memory files
# and session directories by hostname, and hosts that share one would open each other's. The caller provides $tmp (a scratch directory) and removes the set-up with ns_teardown.
#
#   ns_setup NODES SLOTS     make the namespaces, the bridge, the agent and the hostfile; 1 + $ns_why if not
#   ns_mpirun [-x V=X]... -- PROGRAM ARGS...  mpirun from node 0 over all NODES x SLOTS ranks, by slot
#   ns_link NODE up|down     set a node's veth up or down (a node lost from the network)
#   ns_cut LOG STEP NODE     NODE's link down once a run's LOG reaches step STEP; waits for its error line
#   ns_qdisc QDISC ARGS...   the same tc qdisc on each node's egress (tbf rate 100mbit ..., netem delay 3ms ...);
#                            ns_qdisc none removes it; 1 + $ns_why if tc refuses
#   ns_tx_bytes              the bytes the nodes' links have sent so far, all nodes together
#   ns_pids                  the processes still running inside the namespaces
#   ns_reap JOB              kill the launcher JOB and what runs in the namespaces; $ns_left: what outlived it
#   ns_teardown              kill what runs inside them and delete them

ns_id=zs$$
ns_net=10.79.$(($$ % 200 + 20))
ns_nodes=0 ns_slots=0 ns_why=

ns_name() { echo "${ns_id}n$1"; }
ns_ip() { echo "$ns_net.$(($1 + 1))"; }

ns_setup() {
  local n
  ns_nodes=$1 ns_slots=$2
  command -v ip > /dev/null || { ns_why="no ip (iproute2)"; return 1; }
  ip netns add "${ns_id}sw" 2> "$tmp/ns_err" || { ns_why="network namespaces cannot be made here: $(cat "$tmp/ns_err")"; return 1; }
  ip -n "${ns_id}sw" link add br0 type bridge 2> "$tmp/ns_err" && ip -n "${ns_id}sw" link set br0 up ||
    { ns_why="no Linux bridge: $(cat "$tmp/ns_err")"; return 1; }
  : > "$tmp/hosts"
  for ((n = 0; n < ns_nodes; n++)); do
    ip netns add "$(ns_name $n)" &&
      ip link add "v${ns_id}n$n" type veth peer name "s${ns_id}n$n" 2> "$tmp/ns_err" &&
      ip link set "v${ns_id}n$n" netns "$(ns_name $n)" && ip link set "s${ns_id}n$n" netns "${ns_id}sw" &&
      ip -n "${ns_id}sw" link set "s${ns_id}n$n" master br0 && ip -n "${ns_id}sw" link set "s${ns_id}n$n" up &&
      ip -n "$(ns_name $n)" addr add "$(ns_ip $n)/24" dev "v${ns_id}n$n" &&
      ip -n "$(ns_name $n)" link set "v${ns_id}n$n" up && ip -n "$(ns_name $n)" link set lo up ||
      { ns_why="node $n's network could not be set up: $(cat "$tmp/ns_err")"; return 1; }
    echo "$(ns_ip $n) slots=$ns_slots" >> "$tmp/hosts"
  done
  # Open MPI's rsh launcher calls AGENT HOST COMMAND...: the agent runs the command in that host's namespace.
  cat > "$tmp/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case \$host in $ns_net.*) n=\$((\${host##*.} - 1)) ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
[ "\$n" -ge 0 ] && [ "\$n" -lt $ns_nodes ] || { echo "agent: unknown host \$host" >&2; exit 1; }
exec ip netns exec ${ns_id}n\$n unshare --uts sh -c "hostname ${ns_id}n\$n && \$*"
AGENT
  chmod +x "$tmp/agent"
}

# Ranks by slot: node n holds ranks n*SLOTS .. n*SLOTS+SLOTS-1, consecutive, as ZeroShard's node layout needs.
# vader (shared memory) inside a node, tcp between, on the namespaces' network only.
ns_mpirun() {
  local x=()
  [ -n "${LD_LIBRARY_PATH:-}" ] && x+=(-x LD_LIBRARY_PATH)
  while [ "${1:-}" = -x ]; do x+=(-x "$2"); shift 2; done
  [ "${1:-}" = -- ] && shift
  timeout -k 5 "${NS_LIMIT:-120}" ip netns exec "$(ns_name 0)" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$(ns_name 0)" mpirun -np $((ns_nodes * ns_slots)) \
    --hostfile "$tmp/hosts" --map-by slot ${NS_MPI_FLAGS:-} \
    --mca plm_rsh_agent "$tmp/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$ns_net.0/24" --mca btl self,vader,tcp --mca btl_tcp_if_include "$ns_net.0/24" \
    -x PATH "${x[@]}" "$@"
}

ns_link() { ip -n "$(ns_name "$1")" link set "v${ns_id}n$1" "$2"; }

# ns_cut LOG STEP NODE: once LOG shows step STEP, NODE's link goes down; returns when LOG holds an error
# line (20 s at most), with the seconds waited for it in $ns_cut_s
ns_cut() {
  local t0
  for _ in $(seq 600); do grep -q "^step $2 " "$1" 2> /dev/null && break; sleep 0.05; done
  ns_link "$3" down
  t0=$(date +%s)
  for _ in $(seq 200); do grep -q 'zeroshard: error' "$1" && break; sleep 0.1; done
  ns_cut_s=$(($(date +%s) - t0))
}

ns_qdisc() {
  local n
  for ((n = 0; n < ns_nodes; n++)); do
    tc -n "$(ns_name $n)" qdisc del dev "v${ns_id}n$n" root 2> /dev/null
    [ "$1" = none ] && continue
    tc -n "$(ns_name $n)" qdisc add dev "v${ns_id}n$n" root "$@" 2> "$tmp/ns_err" || { ns_why=$(cat "$tmp/ns_err"); return 1; }
  done
}

# ns_reap JOB: end a launcher left waiting for a lost node (JOB, its pid here) and what still runs in the
# namespaces; $ns_left: the pids that outlived it (none expected)
ns_reap() {
  kill "$1" 2> /dev/null
  sleep 0.5
  for p in $(ns_pids); do kill -9 $p 2> /dev/null; done
  wait "$1" 2> /dev/null
  sleep 0.5
  ns_left=$(ns_pids)
}

# ns_tx_bytes: the bytes all nodes' links have sent so far (the kernel's counters, headers included)
ns_tx_bytes() {
  local n sum=0
  for ((n = 0; n < ns_nodes; n++)); do
    sum=$((sum + $(ip netns exec "$(ns_name $n)" cat "/sys/class/net/v${ns_id}n$n/statistics/tx_bytes")))
  done
  echo $sum
}

ns_pids() {
  local n
  ip netns pids "${ns_id}sw" 2> /dev/null
  for ((n = 0; n < ns_nodes; n++)); do ip netns pids "$(ns_name $n)" 2> /dev/null; done
}

ns_teardown() {
  local n pids
  pids=$(ns_pids)
  [ -n "$pids" ] && kill -9 $pids 2> /dev/null
  for ((n = 0; n < ns_nodes; n++)); do ip netns del "$(ns_name $n)" 2> /dev/null; done
  ip netns del "${ns_id}sw" 2> /dev/null
  return 0
}

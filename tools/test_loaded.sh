#!/usr/bin/env bash
# test_loaded.sh [--no-build] [--hogs N] [--quiet LOG] - the README's test command (tools/test.sh) with 4 busy
# processes beside it, as on a shared CI machine: whatever the suite waits for must come from its own progress,
# not from having the cores to itself. Prints the run's wall time, the load average it saw, each pass's summary
# and the slowest tests (beside their time in LOG, the output of a quiet run, if given); exits non-zero when a
# test failed or timed out. --no-build: only the ctest passes, over the builds already made (tools/test.sh
# --no-build). --hogs N: N busy processes instead of 4 (0: the quiet run to compare with). The output goes to
# test_loaded.log (ZS_LOAD_LOG), the load samples beside it.
set -u
cd "$(dirname "$0")/.."
args=() quiet= n=4
while [ $# -gt 0 ]; do
  case $1 in
    --no-build) args+=(--no-build) ;;
    --hogs) n=$2; shift ;;
    --quiet) quiet=$2; shift ;;
    *) echo "usage: tools/test_loaded.sh [--no-build] [--hogs N] [--quiet LOG]" >&2; exit 2 ;;
  esac
  shift
done
log=${ZS_LOAD_LOG:-test_loaded.log}
loads=$log.loadavg
hogs=() run=
# On any exit: the busy processes and the sampler go, and on an interrupt the test run too (its own process
# group: ctest, mpirun and the ranks with it).
stop() {
  [ -z "$run" ] || kill -- -"$run" 2> /dev/null
  [ ${#hogs[@]} -eq 0 ] || { kill "${hogs[@]}" 2> /dev/null; wait "${hogs[@]}" 2> /dev/null; }
  hogs=() run=
}
trap stop EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$n"); do
  sh -c 'while :; do :; done' &
  hogs+=($!)
done
# The 1-minute load average every 30 s, for as long as the suite runs.
while :; do cut -d' ' -f1 /proc/loadavg; sleep 30; done > "$loads" &
hogs+=($!)

start=$(date +%s)
: > "$log"
setsid bash tools/test.sh "${args[@]}" > "$log" 2>&1 &
run=$!
tail -n +1 -f --pid="$run" "$log" &
show=$!
hogs+=($show)
wait "$run" # a signal ends the wait at once (a foreground command would hold the trap until it finished)
rc=$?
run=
wait "$show" # the run's last lines
secs=$(($(date +%s) - start))
stop

# Each test's line of ctest's output as "SECONDS NAME RESULT PASS" (PASS: the build directory it ran from).
times() {
  awk '/^Test project / {n = split($3, p, "/"); pass = p[n]}
       /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / {
         r = $5; sub(/^[.]*[*]*/, "", r); if (r == "") {r = $6; sub(/^[*]*/, "", r)}
         print $(NF - 1), $4, r, pass}' "$1"
}
echo
echo "== tools/test.sh ${args[*]} beside $n busy processes on $(nproc) cores"
echo "wall time $((secs / 60)) min $((secs % 60)) s; 1-minute load average: mean $(awk '{s += $1} END {printf "%.1f", s / NR}' "$loads"), max $(sort -n "$loads" | tail -1)"
grep -E '^[0-9]+% tests passed|^Total Test time' "$log"
echo "slowest tests (each pass's run of a test is a line${quiet:+; quiet: the time in $quiet}):"
times "$log" | sort -rn | head -20 | while read -r t name result pass; do
  q=
  [ -n "$quiet" ] && q=$(times "$quiet" | awk -v n="$name" -v p="$pass" '$2 == n && $4 == p {print $1 " s quiet"}')
  printf '  %-34s %-11s %8s s %-9s %s\n' "$name" "$pass" "$t" "$result" "$q"
done
bad=$(grep -E '^ *[0-9]+/[0-9]+ Test .*(Failed|Timeout|Exception|Not Run)' "$log")
[ -n "$bad" ] && { echo "failed or timed out:"; echo "$bad"; }
[ "$rc" -eq 0 ] && [ -z "$bad" ]

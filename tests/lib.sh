# lib.sh - what the test scripts share (sourced): a scratch directory on the disk under test, removed at
# exit; mpirun allowed as root; the pass/fail tally and its summary line.
tmp=$(mktemp -d -p "${ZS_TEST_NVME_DIR:-$PWD}")
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pass=0 fail=0
check() { if [ "$1" = ok ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }
# A run that should have succeeded and did not fails the test, whatever is compared afterwards (two failed
# runs must never compare equal, an empty hash must never vanish from a list). Recorded in a file, so a
# run inside a command substitution counts too.
run_failed() { echo "$*" | tr '\n' ' ' >> "$tmp/failed_runs"; echo >> "$tmp/failed_runs"; echo "FAIL: run failed: $*" >&2; }
# the line that says why a run stopped: its first error line, else its last line
why_failed() { grep -m1 'error:' "$1" || tail -n 1 "$1"; }
failed_runs() { if [ -f "$tmp/failed_runs" ]; then wc -l < "$tmp/failed_runs"; else echo 0; fi; }
finish() {
  local nf
  nf=$(failed_runs)
  fail=$((fail + nf))
  [ "$nf" -eq 0 ] || echo "$1: $nf runs failed (each counted as a failure)"
  echo "$1: $pass passed, $fail failed"
  [ $fail -eq 0 ]
}
# The examples' --device cuda (mlp_device.sh, gpt_device.sh). gpu_visible: nvidia-smi sees a GPU.
gpu_visible() { nvidia-smi -L > /dev/null 2>&1; }
# no_gpu_refused OUT RC HASH: a --device cuda run on a machine without a GPU exited non-zero, naming the
# refusal in rank 0's error line, with no params-hash (never trained on the CPU instead)
no_gpu_refused() {
  local msg r
  msg=$(grep -m1 'error: rank 0: --device cuda:' "$1")
  [ "$2" -ne 0 ] && [ -n "$msg" ] && [ -z "$3" ] && r=ok || r=bad
  echo "--device cuda without a GPU: rc $2, '$msg' $r"; check $r "--device cuda without a GPU was not refused"
}

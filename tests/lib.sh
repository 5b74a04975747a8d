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
# the line that says why a run stopped: its first error line (ours, or a sanitizer's), else what mpirun said
# of the process that stopped it (its banner lines of dashes skipped), else its last line
why_failed() {
  local m
  grep -m1 -e 'error:' -e 'ERROR: [A-Za-z]*Sanitizer' -e 'runtime error' "$1" && return
  m=$(grep -e 'exited on signal' -e 'Process name:' -e 'Exit code:' -e 'Signal:' "$1" | tr -s ' ' | tr '\n' ' ')
  [ -n "$m" ] && { echo "mpirun: $m"; return; }
  grep -v -e '^-*$' -e '^ *$' "$1" | tail -n 1
}
failed_runs() { if [ -f "$tmp/failed_runs" ]; then wc -l < "$tmp/failed_runs"; else echo 0; fi; }
finish() {
  local nf
  nf=$(failed_runs)
  fail=$((fail + nf))
  [ "$nf" -eq 0 ] || echo "$1: $nf runs failed (each counted as a failure)"
  echo "$1: $pass passed, $fail failed"
  [ $fail -eq 0 ]
}
# The Python tests' set-up (fw_*.sh): skip (77) unless python3 imports MODULES ("torch, lightning"), then the
# package from the checkout's python/ and libzeroshard from LIBDIR, Hugging Face offline. py_test_env NAME MODULES LIBDIR
py_test_env() {
  local err
  err=$(python3 -c "import $2" 2>&1) ||
    { echo "$1: SKIP: python3 cannot import $2 (${err##*$'\n'}); bash tools/setup_tests.sh installs them"; exit 77; }
  export PYTHONPATH=$here/../python${PYTHONPATH:+:$PYTHONPATH} ZEROSHARD_LIB=$3/libzeroshard.so
  export TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1
}
# The examples' --device cuda (mlp_device.sh, gpt_device.sh). gpu_visible: nvidia-smi sees a GPU.
gpu_visible() { nvidia-smi -L > /dev/null 2>&1; }
# The shared checks of their cpu mode; run NAME RANKS [FLAGS] and hash_of NAME are the calling script's.
# device_cpu_matches NAME RANKS: --device cpu gives the default run's params-hash
device_cpu_matches() {
  local h0 h1 r
  run "$1" "$2" || run_failed "default: $(why_failed "$tmp/$1.out")"; h0=$(hash_of "$1")
  run "$1" "$2" --device cpu || run_failed "--device cpu: $(why_failed "$tmp/$1.out")"; h1=$(hash_of "$1")
  [ -n "$h0" ] && [ "$h0" = "$h1" ] && r=ok || r=bad
  echo "--device cpu params-hash $h1, default $h0: $r"; check $r "--device cpu $h1 != default $h0"
}
# no_gpu_refused NAME RANKS GPU_TEST: on a machine without a GPU, --device cuda exits non-zero naming the
# refusal in rank 0's error line, with no params-hash (never trained on the CPU instead); with a GPU,
# GPU_TEST is the check
no_gpu_refused() {
  local msg r rc
  if gpu_visible; then
    echo "a GPU is visible: the refusal without one is not checked here ($3 is the GPU check)"
    return
  fi
  run "$1" "$2" --device cuda; rc=$?
  msg=$(grep -m1 'error: rank 0: --device cuda:' "$tmp/$1.out")
  [ $rc -ne 0 ] && [ -n "$msg" ] && [ -z "$(hash_of "$1")" ] && r=ok || r=bad
  echo "--device cuda without a GPU: rc $rc, '$msg' $r"; check $r "--device cuda without a GPU was not refused"
}

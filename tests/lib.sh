# lib.sh - what the test scripts share (sourced): a scratch directory on the disk under test, removed at
# exit; mpirun allowed as root; the pass/fail tally and its summary line.
tmp=$(mktemp -d -p "${ZS_TEST_NVME_DIR:-$PWD}")
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pass=0 fail=0
check() { if [ "$1" = ok ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }
finish() { echo "$1: $pass passed, $fail failed"; [ $fail -eq 0 ]; }

#!/usr/bin/env bash
# check_choosing.sh [BUILD_DIR] [PAGE] - re-runs every zs-estimate command shown in docs/choosing.md and
# compares its output with the output the page shows under it, so the page cannot drift from the tool.
# A command is a line "$ build/zs-estimate ..." inside a ``` block; its output is the block's following
# lines, up to the next "$ " line or the closing fence. Exits 0 when every output matches, 1 when one
# differs (with a diff) or the page shows none, 77 when BUILD_DIR/zs-estimate is missing.
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
page=${2:-docs/choosing.md}
est=$build/zs-estimate
if [ ! -x "$est" ]; then
  echo "check_choosing: skipped: $est not built"
  exit 77
fi
[ -r "$page" ] || { echo "check_choosing: cannot read $page"; exit 1; }
# --help: the usage on stdout, exit 0 (the page tells readers to run it)
help=$("$est" --help 2> /dev/null) && grep -q -- '--world N' <<< "$help" ||
  { echo "check_choosing: FAIL: $est --help does not print its usage on stdout and exit 0"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Writes each command to cmd.N and the output the page shows to want.N.
awk -v dir="$tmp" '
  /^```/ { infence = !infence; cur = ""; next }
  infence && /^\$ build\/zs-estimate / { n++; cur = dir "/want." n; printf "" > cur
                                        print substr($0, 3) > (dir "/cmd." n); next }
  infence && /^\$ / { cur = ""; next }
  infence && cur != "" { print > cur }
' "$page"

pass=0 fail=0
for cmd in "$tmp"/cmd.*; do
  [ -e "$cmd" ] || break
  n=${cmd##*.}
  line=$(cat "$cmd")
  # the page's build/ is this run's build directory; the shell runs the rest as written (<(...) included)
  (bash -c "$build/${line#build/}" > "$tmp/got.$n" 2>&1)
  if diff -u "$tmp/want.$n" "$tmp/got.$n" > "$tmp/diff.$n"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $page shows another output for: $line"
    sed 's/^/  /' "$tmp/diff.$n"
  fi
done
if [ $((pass + fail)) = 0 ]; then
  echo "check_choosing: no zs-estimate command found in $page"
  exit 1
fi
echo "check_choosing: $pass passed, $fail failed"
[ "$fail" = 0 ]

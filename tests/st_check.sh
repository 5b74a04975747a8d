#!/usr/bin/env bash
# st_check.sh TEST_CKPT_FORMAT ZS_CKPT ST_CHECK_PY - zs-ckpt export read back by the reference safetensors
# package (st_check.py): fp32, bf16, and sharded with an index. Exits 77 when safetensors or numpy is not
# installed for python3.
set -u
GEN=$1 ZS=$2 PY=$3
python3 -c 'import safetensors, numpy' 2> /dev/null || { echo "st_check: skipped: pip install safetensors numpy"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if [ "$1" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }

"$GEN" --write-sample "$tmp/ck"
ref=$tmp/ck/params.f32
"$ZS" export "$tmp/ck" "$tmp/m.safetensors" > /dev/null && python3 "$PY" "$tmp/m.safetensors" "$ref"
check $? "fp32 export"
"$ZS" export "$tmp/ck" "$tmp/b.safetensors" --dtype bf16 --buffer 64 > /dev/null &&
  python3 "$PY" --dtype bf16 "$tmp/b.safetensors" "$ref"
check $? "bf16 export"
mkdir "$tmp/sh"
"$ZS" export "$tmp/ck" "$tmp/sh/model.safetensors" --max-shard-size 1000 > /dev/null &&
  python3 "$PY" "$tmp/sh/model.safetensors.index.json" "$ref"
check $? "sharded export"
# the checker itself must notice a wrong dtype and a changed value
python3 "$PY" "$tmp/b.safetensors" "$ref" > /dev/null
check $(($? != 1)) "st_check.py accepted a bf16 file as fp32"
printf '\x55' | dd of="$tmp/m.safetensors" bs=1 seek=$(($(stat -c %s "$tmp/m.safetensors") - 2)) conv=notrunc 2> /dev/null
python3 "$PY" "$tmp/m.safetensors" "$ref" > /dev/null
check $(($? != 1)) "st_check.py accepted a changed value"

echo "st_check: $pass passed, $fail failed"
[ $fail = 0 ]

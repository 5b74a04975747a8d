#!/usr/bin/env bash
# ckpt_cli.sh TEST_CKPT_FORMAT ZS_CKPT - zs-ckpt as scripts use it: info and verify of a sample checkpoint,
# export byte-exact against the raw weights (any buffer size, one file or shards with an index), and every
# failure one "zs-ckpt:" line on stderr naming the file, exit 1 (2 for usage).
set -u
GEN=$1 ZS=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { if [ "$1" = ok ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $2" >&2; fi; }
is() { [ "$@" ] && echo ok || echo bad; }
# The tensor data of a safetensors file: everything after the 8-byte length and the header.
data_of() { local n; n=$(od -An -tu8 -N8 "$1" | tr -d ' '); tail -c +$((9 + n)) "$1"; }
# Runs a command expected to fail: exit status $1, one stderr line starting "zs-ckpt:" containing $2.
fails() {
  local want=$1 text=$2; shift 2
  "$@" > "$tmp/out" 2> "$tmp/err"; local rc=$?
  [ $rc = "$want" ] && [ "$(wc -l < "$tmp/err")" = 1 ] && grep -q "^zs-ckpt: .*$text" "$tmp/err" && echo ok || {
    echo "rc $rc, stderr: $(cat "$tmp/err")" >&2; echo bad; }
}

ck=$tmp/ck tag=$tmp/ck/global_step7
"$GEN" --write-sample "$ck"
check "$(is -f "$tag/manifest.json")" "sample not written"

out=$("$ZS" info "$ck")
echo "$out"
check "$(is "$(echo "$out" | grep -c -e '^global_step: 7$' -e '^world_size: 3$' -e '^parameters: 7 (1272 elements)$' \
  -e '^kinds: param exp_avg exp_avg_sq$' -e '^files: 3 (15336 bytes)$')" = 5)" "info summary"
check "$(is "$("$ZS" info "$tag" | head -1)" = "tag: $tag")" "info of the tag directory itself"
out=$("$ZS" verify "$ck"); rc=$?
check "$(is $rc = 0 -a "$(echo "$out" | grep -c '^ok ')" = 4)" "verify: rc $rc: $out"

# export: data identical to the raw weights, whatever the buffer; shards cut between parameters only
"$ZS" export "$ck" "$tmp/m.safetensors" > /dev/null
data_of "$tmp/m.safetensors" | cmp -s - "$ck/params.f32"
check "$(is $? = 0)" "fp32 export differs from the raw weights"
"$ZS" export "$ck" "$tmp/m4.safetensors" --buffer 4 --no-verify > /dev/null
cmp -s "$tmp/m.safetensors" "$tmp/m4.safetensors"
check "$(is $? = 0)" "--buffer 4 changes the export"
out=$("$ZS" export "$ck" "$tmp/sh/model.safetensors" --max-shard-size=2KB --buffer 12 2>&1)
check "$(is $? = 1)" "export into a missing directory succeeded"
mkdir "$tmp/sh"
"$ZS" export "$ck" "$tmp/sh/model.safetensors" --max-shard-size 2KB --buffer 12 > "$tmp/out"
check "$(is "$(ls "$tmp/sh" | tr '\n' ' ')" = "model-00001-of-00003.safetensors model-00002-of-00003.safetensors \
model-00003-of-00003.safetensors model.safetensors.index.json ")" "shard names: $(ls "$tmp/sh")"
for f in "$tmp"/sh/model-0000?-of-00003.safetensors; do data_of "$f"; done | cmp -s - "$ck/params.f32"
check "$(is $? = 0)" "shards together differ from the raw weights"
check "$(is "$(grep -c '"total_size": 5088' "$tmp/sh/model.safetensors.index.json")" = 1)" "index total_size"
"$ZS" export "$ck" "$tmp/one.safetensors" --max-shard-size 1GB > /dev/null
check "$(is -f "$tmp/one.safetensors" -a ! -e "$tmp/one.safetensors.index.json")" "one shard: plain file, no index"
"$ZS" export "$ck" "$tmp/b.safetensors" --dtype bf16 > /dev/null
check "$(is "$(data_of "$tmp/b.safetensors" | wc -c)" = 2544)" "bf16 export size"
out=$("$ZS" st-dump "$tmp/b.safetensors" --values 2)
check "$(is "$(echo "$out" | grep -c -e '^embed.weight BF16 \[37, 16\]' -e '^norm.g BF16 \[\]' \
  -e '^metadata source = zeroshard$' -e '^  values: -40 ')" = 4)" "st-dump: $out"

# failures
fl=$tag/rank00001.bin
cp "$fl" "$tmp/saved"
truncate -s 100 "$fl"
check "$(fails 1 "rank00001.bin: ends at byte offset 100" "$ZS" verify "$ck")" "verify of a truncated file"
check "$(fails 1 "rank00001.bin: ends at byte offset" "$ZS" export "$ck" "$tmp/x.safetensors")" "export verifies"
check "$(fails 1 "rank00001.bin: read at byte offset" "$ZS" export "$ck" "$tmp/x.safetensors" --no-verify)" \
  "export --no-verify of a truncated file"
check "$(is ! -e "$tmp/x.safetensors" -a ! -e "$tmp/x.safetensors.tmp")" "failed export left files"
cp "$tmp/saved" "$fl"
printf '\x01' | dd of="$fl" bs=1 seek=100 conv=notrunc 2> /dev/null
check "$(fails 1 "rank00001.bin: crc32c 0x" "$ZS" verify "$ck")" "verify of a changed byte"
cp "$tmp/saved" "$fl"
sed -i 's/"stage": 3/"stage": 9/' "$tag/manifest.json"
check "$(fails 1 "manifest.json: stage: 9 is out of range" "$ZS" info "$ck")" "bad manifest"
check "$(fails 1 "not a checkpoint" "$ZS" info "$tmp/nothing")" "missing directory"
check "$(fails 1 "header length" "$ZS" st-dump "$ck/params.f32")" "st-dump of a non-safetensors file"
check "$(fails 2 "usage" "$ZS")" "no command"
check "$(fails 2 "bad option" "$ZS" export "$ck" "$tmp/x" --dtype fp8)" "bad --dtype"
check "$(fails 2 "bad option" "$ZS" export "$ck" "$tmp/x" --buffer 2)" "--buffer below 4"
"$ZS" info "$ck" --dtype bf16 > /dev/null 2>&1
check "$(is $? = 2)" "export option given to info"
"$ZS" frobnicate "$ck" > /dev/null 2>&1
check "$(is $? = 2)" "unknown command"
"$ZS" --help | grep -q "usage: zs-ckpt info DIR"
check "$(is $? = 0)" "--help"

echo "ckpt_cli: $pass passed, $fail failed"
[ $fail = 0 ]

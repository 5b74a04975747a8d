#!/usr/bin/env bash
# bench_swap_mode.sh BENCH - zs-bench swap reports its I/O mode, and where the swapper
# fell back to buffered I/O (forced here by the test hook ZS_TEST_SWAP_BUFFERED=1, as on a file system
# without O_DIRECT) it prints no ratio against fio --direct=1 and --require-fio fails, saying why.
set -u
BENCH=$1
source "$(dirname "$0")/lib.sh"
run() { (cd "$tmp" && "$BENCH" swap --size 8M --reps 1 --no-step "$@" 2>&1); }

out=$(ZS_TEST_SWAP_BUFFERED=1 run); rc=$?
echo "buffered: rc $rc: $(echo "$out" | grep '^ratio')"
[ $rc -eq 0 ] && echo "$out" | grep -q '^ratio write: -, read: - (refused: zeroshard buffered, fio O_DIRECT' && r=ok || r=bad
check $r "a ratio was printed against fio with zeroshard buffered: $out"
echo "$out" | grep -q '^read      zeroshard buffered' && ! echo "$out" | grep -q '^[a-z-]* *fio ' && r=ok || r=bad
check $r "the table does not show zeroshard's mode, or has fio rows: $out"
echo "$out" | grep -q '"impl": "zeroshard", "io": "buffered"' && r=ok || r=bad
check $r "the JSON lines do not carry the mode: $out"
out=$(ZS_TEST_SWAP_BUFFERED=1 run --require-fio); rc=$?
echo "buffered, --require-fio: rc $rc: $(echo "$out" | grep -m1 'require-fio')"
why="not a like-for-like comparison"
command -v fio > /dev/null || why="fio is not on PATH" # then that is the first reason to refuse
[ $rc -ne 0 ] && echo "$out" | grep -q "$why" && r=ok || r=bad
check $r "--require-fio with zeroshard buffered did not fail naming why: rc $rc: $out"
# where the disk takes O_DIRECT the rows say direct (the swap test demands O_DIRECT there)
out=$(run --no-fio); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q '^read      zeroshard \(direct\|buffered\)' && r=ok || r=bad
check $r "the direct run does not report its mode: rc $rc: $out"
finish bench_swap_mode

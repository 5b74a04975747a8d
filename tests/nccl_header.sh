#!/usr/bin/env bash
# nccl_header.sh SRC NCCL_INCLUDE_DIR - nccl.h found outside the system directories (NCCL's pip wheel) still
# builds under -Werror: it declares `ncclGroupStart();`, which -Wstrict-prototypes refuses unless CMake
# includes it as a system header. Configures a scratch build with a copy of nccl.h in a plain directory and
# compiles comm/comm_nccl.c alone, with the project's flags; the dependency file shows the copy was the one
# read. 77 (skip) without the CUDA backend.
set -u
src=$1
inc=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/nccl" && cp "$inc/nccl.h" "$tmp/nccl/" || exit 1
grep -q 'ncclGroupStart();' "$tmp/nccl/nccl.h" || sed -i 's/ncclGroupStart(void)/ncclGroupStart()/' "$tmp/nccl/nccl.h"
cmake -S "$src" -B "$tmp/b" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZS_WERROR=ON -DZS_NCCL_INCLUDE_DIR="$tmp/nccl" \
      > "$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; exit 1; }
grep -q 'comm_nccl.c.o:' "$tmp/b/CMakeFiles/zs_objects.dir/build.make" ||
    { echo "SKIP: no CUDA backend in this build"; exit 77; }
if ! make -C "$tmp/b" -f CMakeFiles/zs_objects.dir/build.make CMakeFiles/zs_objects.dir/comm/comm_nccl.c.o > "$tmp/make.log" 2>&1; then
    cat "$tmp/make.log"
    echo "FAIL: comm/comm_nccl.c does not build against nccl.h in $tmp/nccl (not a system header?)"
    exit 1
fi
if ! grep -q "$tmp/nccl/nccl.h" "$tmp/b/CMakeFiles/zs_objects.dir/comm/comm_nccl.c.o.d"; then
    echo "FAIL: the build read another nccl.h than the copy"
    exit 1
fi
echo "ok - comm/comm_nccl.c builds with -Werror against nccl.h from a plain directory"

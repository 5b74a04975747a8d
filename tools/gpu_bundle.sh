#!/usr/bin/env bash
# gpu_bundle.sh [BUNDLE_DIR] [--from BUILD_DIR] [--no-deepspeed] - packs what tools/gpu_check.sh runs into one
# folder for a GPU machine that has the CUDA driver, NCCL and cuBLAS (pip wheels) but no Open MPI, hwloc, liburing,
# jansson or OpenBLAS, and where nothing can be installed: the programs, libzeroshard, every shared library they
# need that such an image lacks (found with ldd), Open MPI's launcher and plugins (relocated by OPAL_PREFIX),
# env.sh, and in py/ the wheels of DeepSpeed 0.19.8 and of what it imports that the image lacks (for the PyTorch
# stage's comparison; --no-deepspeed leaves them out). Without --from it first builds them (ZS_CUDA=ON, sm_80 and
# sm_90, Release) in build-bundle/; with --from it takes them from a CUDA-enabled build. Default BUNDLE_DIR:
# gpu-bundle/ at the repository root.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/gpu-bundle from="" deepspeed=1
while [ $# -gt 0 ]; do
  case $1 in
    --from) from=${2:?--from needs a build directory}; shift 2 ;;
    --no-deepspeed) deepspeed=""; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) out=$1; shift ;;
  esac
done
die() { echo "gpu_bundle: error: $*" >&2; exit 1; }

# What gpu_check.sh runs, relative to a build directory.
PROGRAMS="tests/test_device tests/test_comm_cuda tests/test_nccl tests/test_staged tests/test_devpath tests/test_devmem
          zs-bench zs-train-mlp zs-train-gpt"
# Libraries the lent image has, so they are not packed: glibc's, the compiler's C++ runtime, the CUDA driver,
# and the CUDA libraries that come with the toolkit or as pip wheels (env.sh finds the wheels' copies).
SYSTEM_LIBS='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libresolv|libanl|libstdc\+\+|libgcc_s)\.so'
CUDA_LIBS='^(libcuda|libnvidia-[a-z-]+|libcudart|libnccl|libcublas|libcublasLt)\.so'
# Open MPI plugins left out: network fabrics (a one-node run talks through shared memory, and their libraries
# are tens of MiB the image lacks) and OpenSHMEM, which ZeroShard does not use.
FABRIC_LIBS='^(libfabric|libucp|libucs|libuct|libucm|libpsm_infinipath|libpsm2|libibverbs|librdmacm|liboshmem)\.so'
# Programs and libraries above this many bytes are stored gzipped (OpenBLAS and oneDNN alone are 36 and 40 MB,
# the programs 2 MB each; a third of that gzipped); env.sh unpacks them into a scratch folder.
GZIP_ABOVE=$((1024 * 1024))

build() {
  local dir=$root/build-bundle t targets=""
  for t in $PROGRAMS; do targets="$targets ${t##*/}"; done
  echo "gpu_bundle: building in $dir (log: $dir.log)"
  { cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DZS_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="80;90" \
      -DZS_WERROR=ON && cmake --build "$dir" -j "$(nproc)" --target zeroshard $targets; } > "$dir.log" 2>&1 ||
    { tail -20 "$dir.log"; die "the build failed (see $dir.log)"; }
  from=$dir
}

# check_from: every program is there and the library carries CUDA kernels for the H200 (sm_90).
check_from() {
  local t missing=""
  [ -d "$from" ] || die "$from: no such build directory"
  for t in $PROGRAMS libzeroshard.so; do [ -e "$from/$t" ] || missing="$missing $t"; done
  [ -z "$missing" ] || die "$from lacks$missing (build them: cmake --build $from --target zeroshard ...)"
  readelf -S "$from/libzeroshard.so" | grep -q nv_fatbin ||
    die "$from was built without the CUDA backend (no kernels in libzeroshard.so): configure it with -DZS_CUDA=ON"
  if command -v cuobjdump > /dev/null && ! cuobjdump --list-elf "$from/libzeroshard.so" 2>/dev/null | grep -q sm_90; then
    die "$from's kernels have no sm_90 code (the H200's): configure it with -DCMAKE_CUDA_ARCHITECTURES=\"80;90\""
  fi
}

# ompi_dir KEY: one of Open MPI's install directories (Prefix, Pkglibdir, Pkgdatadir, Sysconfdir, Bindir)
ompi_dir() { ompi_info --path all | awk -v k="$1:" '$1 == k {print $2; exit}'; }

# pack_ompi: the launcher in bin/, the plugins and help files at their places under the bundle as under
# Open MPI's prefix (so OPAL_PREFIX=BUNDLE finds them), its parameter file in etc/.
pack_ompi() {
  local prefix pkglib pkgdata f
  command -v ompi_info > /dev/null || die "no ompi_info: Open MPI (openmpi-bin) is needed to pack its launcher"
  prefix=$(ompi_dir Prefix) pkglib=$(ompi_dir Pkglibdir) pkgdata=$(ompi_dir Pkgdatadir)
  case $pkglib$pkgdata in "$prefix"/*"$prefix"/*) ;; *) die "Open MPI's plugins are not under its prefix $prefix" ;; esac
  cp "$(ompi_dir Bindir)/orterun" "$out/bin/mpirun"
  cp "$(ompi_dir Bindir)/orted" "$out/bin/orted"
  mkdir -p "$out/${pkglib#$prefix/}" "$out/${pkgdata#$prefix/}" "$out/etc"
  for f in "$pkglib"/*.so; do
    ldd "$f" | awk '{print $1}' | grep -qE "$FABRIC_LIBS" && continue
    cp "$f" "$out/${pkglib#$prefix/}/"
  done
  cp -r "$pkgdata"/. "$out/${pkgdata#$prefix/}/"
  grep -v '^btl *=' "$(ompi_dir Sysconfdir)/openmpi-mca-params.conf" > "$out/etc/openmpi-mca-params.conf" || :
  # One node: ranks talk through shared memory (TCP would look for network interfaces the machine may not
  # have), and by copies through it alone: cross-memory attach needs ptrace rights a VM's kernel may refuse.
  printf '# gpu_bundle.sh: one node\nbtl = self,vader\nbtl_vader_single_copy_mechanism = none\n' \
    >> "$out/etc/openmpi-mca-params.conf"
}

# pack_pmix: PMIx's help files (its library comes with the plugin that loads it)
pack_pmix() {
  local lib
  lib=$(ldd "$out"/lib/*/openmpi/lib/openmpi3/mca_pmix_ext*.so 2>/dev/null | awk '$1 ~ /^libpmix/ {print $3; exit}')
  [ -n "$lib" ] || return 0
  lib=$(dirname "$(readlink -f "$lib")")
  [ -d "$lib/../share" ] || return 0
  mkdir -p "$out/pmix"
  cp -r "$lib/../share" "$out/pmix/"
}

# pack_hwloc: hwloc's PCI plugin, which maps the GPU's bus id to its cores and NUMA node (the others need X11,
# OpenCL or libxml2 and serve nothing here)
pack_hwloc() {
  local f
  f=$(ldd "$out/lib/libzeroshard.so" | awk '$1 ~ /^libhwloc/ {print $3}')
  f=$(dirname "$(readlink -f "$f")")/hwloc/hwloc_pci.so
  [ -f "$f" ] || return 0
  mkdir -p "$out/lib/hwloc"
  cp "$f" "$out/lib/hwloc/"
}

# pack_deps: every library that the packed programs and plugins need (ldd lists each one's whole closure),
# under its soname in lib/, except the image's own; the CUDA ones the image must have are listed in needs.
pack_deps() {
  local f name path
  find "$out/bin" "$out/lib" -type f | while read -r f; do
    [ "$(head -c 4 "$f" | tail -c 3)" = ELF ] || continue
    ldd "$f" | awk '$2 == "=>" {print $1, $3}'
  done | sort -u | while read -r name path; do
    if [ "$path" = not ]; then die "$name, needed by the bundle, is not found here"; fi
    echo "$name" | grep -qE "$SYSTEM_LIBS" && continue
    if echo "$name" | grep -qE "$CUDA_LIBS"; then echo "$name" >> "$out/needs"; continue; fi
    [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
  done
  # NCCL is loaded at run time (dlopen), so ldd does not see it: its soname is read from the library.
  grep -aoE 'libnccl\.so\.[0-9]+' "$out/lib/libzeroshard.so" | head -1 >> "$out/needs"
  sort -u -o "$out/needs" "$out/needs"
}

# DeepSpeed's wheel (pure Python: its ops are compiled there, when needed, by its own JIT) and the wheels of what
# `import deepspeed` needs that the lent image lacks (it has torch, numpy, einops, msgpack, ninja, psutil, py-cpuinfo,
# tqdm and packaging, not hjson or pydantic), for the image's python3 (ZS_BUNDLE_PYTHON, default 3.12). Taken from
# the cache folder ZS_WHEEL_CACHE (default build-bundle/wheels/) where they are, else fetched into it with pip.
DS_WHEEL="deepspeed==0.19.8"
DS_DEPS="hjson==3.1.0 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
         typing-extensions==4.16.0"

# cached NAME==VERSION: the wheel of that version in the cache folder (pip writes - in a name as _)
cached() {
  local n=${1%%==*} v=${1#*==}
  ls "$cache/${n//-/_}-$v-"*.whl 2>/dev/null | head -1
}

# pack_deepspeed: the wheels into py/, or py/WHY saying why not (the check's DeepSpeed lines then say it)
pack_deepspeed() {
  local cache=${ZS_WHEEL_CACHE:-$root/build-bundle/wheels} py=${ZS_BUNDLE_PYTHON:-3.12} w missing=""
  mkdir -p "$out/py"
  [ -n "$deepspeed" ] || { echo "left out: tools/gpu_bundle.sh --no-deepspeed" > "$out/py/WHY"; return 0; }
  mkdir -p "$cache"
  : > "$cache/pip.log"
  if [ -z "$(cached "$DS_WHEEL")" ]; then
    python3 -m pip wheel -q --no-deps -w "$cache" "$DS_WHEEL" >> "$cache/pip.log" 2>&1 || :
  fi
  for w in $DS_DEPS; do [ -n "$(cached "$w")" ] || missing="$missing $w"; done
  if [ -n "$missing" ]; then
    # shellcheck disable=SC2086  # one package a word
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$cache" $missing >> "$cache/pip.log" 2>&1 || :
  fi
  missing=""
  for w in $DS_WHEEL $DS_DEPS; do
    if [ -n "$(cached "$w")" ]; then cp "$(cached "$w")" "$out/py/"; else missing="$missing $w"; fi
  done
  [ -z "$missing" ] && return 0
  rm -f "$out"/py/*.whl
  echo "pip could not fetch$missing for python $py (see $cache/pip.log)" > "$out/py/WHY"
  echo "gpu_bundle: warning: no DeepSpeed in the bundle: $(cat "$out/py/WHY")" >&2
}

[ -n "$from" ] || build
from=$(cd "$from" && pwd)
check_from
# a folder that is there is replaced only if it is an earlier bundle (or empty)
if [ -e "$out" ] && ! { [ -f "$out/MANIFEST" ] && [ -f "$out/env.sh" ]; } && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  die "$out is there and is not a bundle: give another folder"
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
out=$(cd "$out" && pwd)
for t in $PROGRAMS; do cp "$from/$t" "$out/bin/"; done
cp -L "$from/libzeroshard.so" "$out/lib/libzeroshard.so"
strip --strip-unneeded "$out"/bin/* "$out/lib/libzeroshard.so"
pack_ompi
pack_pmix
pack_hwloc
: > "$out/needs"
pack_deps
printf 'from %s\ncommit %s\nglibc needed %s\n' "$from" "$(git -C "$root" rev-parse --short HEAD 2>/dev/null)" \
  "$(objdump -T "$out"/bin/* "$out"/lib/*.so* 2>/dev/null | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1)" > "$out/MANIFEST"
find "$out/bin" "$out/lib" -maxdepth 1 -type f -size +${GZIP_ABOVE}c ! -name '*.gz' -exec gzip -6 {} \;
cp "$root/tools/gpu_bundle_env.sh" "$out/env.sh"
pack_deepspeed
if [ -e "$out/py/WHY" ]; then
  echo "deepspeed none: $(cat "$out/py/WHY")" >> "$out/MANIFEST"
else
  echo "deepspeed $(cd "$out/py" && ls | tr '\n' ' ')" >> "$out/MANIFEST"
fi

size=$(du -sb "$out" | awk '{print $1}')
# what a call carries besides: the tracked files and the untracked ones git does not ignore
tree=$(cd "$root" && git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null |
       tail -1 | awk '{print $1}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "gpu_bundle: $out: $(mib "$size") ($(find "$out/lib" -maxdepth 1 -type f | wc -l) libraries," \
     "$(find "$out/bin" -maxdepth 1 -type f | wc -l) programs, DeepSpeed's wheels $(mib "$(du -sb "$out/py" | awk '{print $1}')"));" \
     "with the working tree ($(mib "$tree")): $(mib $((size + tree))) of the 64 MiB a call carries"
echo "gpu_bundle: the image must provide: $(tr '\n' ' ' < "$out/needs")and $(sed -n 's/^glibc needed //p' "$out/MANIFEST")"
[ $((size + tree)) -lt $((64 * 1024 * 1024)) ] || die "the bundle and the working tree exceed 64 MiB"

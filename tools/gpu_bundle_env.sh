# env.sh - sourced (bash) from a bundle made by tools/gpu_bundle.sh: puts the bundle's programs, libraries and
# Open MPI before the system's (PATH, LD_LIBRARY_PATH, OPAL_PREFIX), and NCCL's and cuBLAS's libraries where the
# image keeps them (the pip wheels under python3's site-packages, else the linker's cache). Unpacks the programs
# and libraries stored gzipped into ZS_BUNDLE_RUN, a scratch folder the caller removes. Prints nothing unless a
# library the image must provide is missing.
# shellcheck shell=bash
zs_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# zs_bundle_unpack: bin/X.gz and lib/X.gz unpacked into ZS_BUNDLE_RUN (a scratch folder, so that the bundle
# folder stays as packed and within what a call carries); programs keep their execute bit
zs_bundle_unpack() {
  local z d
  for z in "$zs_bundle"/bin/*.gz "$zs_bundle"/lib/*.gz; do
    [ -e "$z" ] || continue
    d=$ZS_BUNDLE_RUN/$(basename "$(dirname "$z")")
    mkdir -p "$d"
    gzip -dc "$z" > "$d/$(basename "${z%.gz}")" && chmod --reference="$z" "$d/$(basename "${z%.gz}")" ||
      echo "env.sh: error: cannot unpack $z into $d" >&2
  done
}

# zs_bundle_cuda_dirs: the folders holding the libraries listed in needs, from the pip wheels (nvidia/*/lib)
# of the first python3 that has them; asked before LD_LIBRARY_PATH points into the bundle.
zs_bundle_cuda_dirs() {
  local py site lib found
  for py in /opt/torch/.venv/bin/python3 python3; do
    command -v "$py" > /dev/null 2>&1 || continue
    for site in $("$py" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
      while read -r lib; do
        for found in "$site"/nvidia/*/lib/"$lib"; do
          [ -e "$found" ] && dirname "$found"
        done
      done < "$zs_bundle/needs"
    done
  done | awk '!seen[$0]++'
}

zs_bundle_cuda=$(zs_bundle_cuda_dirs | paste -sd: -)
ZS_BUNDLE_RUN=$(mktemp -d "${TMPDIR:-/tmp}/zs-bundle.XXXXXX")
export ZS_BUNDLE_RUN
zs_bundle_unpack
export LD_LIBRARY_PATH=$ZS_BUNDLE_RUN/lib:$zs_bundle/lib${zs_bundle_cuda:+:$zs_bundle_cuda}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$ZS_BUNDLE_RUN/bin:$zs_bundle/bin:$PATH
# Open MPI finds its plugins and help files under OPAL_PREFIX; its parameter file and PMIx's help files
# lie outside that prefix on Debian, so they are named apart.
export OPAL_PREFIX=$zs_bundle OPAL_SYSCONFDIR=$zs_bundle/etc PMIX_PREFIX=$zs_bundle/pmix
export HWLOC_PLUGINS_PATH=$zs_bundle/lib/hwloc
while read -r zs_need; do
  [ -n "$(for d in ${zs_bundle_cuda//:/ }; do ls "$d/$zs_need" 2>/dev/null; done)" ] && continue
  ldconfig -p 2>/dev/null | grep -q " $zs_need " && continue
  echo "env.sh: warning: $zs_need is neither in a pip wheel nor in the linker's cache: the GPU checks will fail" >&2
done < "$zs_bundle/needs"
unset zs_need zs_bundle_cuda

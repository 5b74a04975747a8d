#!/usr/bin/env bash
# setup.sh - installs the Debian packages ZeroShard builds and tests with, only those missing, and the
# PyPI packages the export test reads safetensors with (optional: without them that check is skipped).
# Run as root (or with sudo available). CUDA, NCCL and cuBLAS are optional and never installed here.
# clang builds the libFuzzer targets of the checkpoint and safetensors parsers; OpenBLAS does the transformer
# example's matrix products (libdnnl-dev, oneDNN, its bf16 ones), fortunes is its default corpus and
# gnuplot-nox draws its loss curve.
set -eu
pkgs="build-essential cmake pkg-config git openmpi-bin libopenmpi-dev libhwloc-dev liburing-dev libjansson-dev fio clang libopenblas-dev libdnnl-dev fortunes gnuplot-nox"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
if [ -z "$missing" ]; then
  echo "setup: all packages present ($pkgs)"
else
  if [ -n "$SUDO" ] && ! command -v sudo > /dev/null; then echo "setup: need root to install:$missing" >&2; exit 1; fi
  echo "setup: installing$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
# Test-side only: the reference safetensors reader (tests/st_check.py). Debian's Python refuses a plain
# pip install (PEP 668), hence the second form; failing here only skips that test.
if command -v python3 > /dev/null && ! python3 -c 'import safetensors, numpy' 2> /dev/null; then
  { python3 -m pip install -q safetensors numpy 2> /dev/null ||
    python3 -m pip install -q --break-system-packages safetensors numpy 2> /dev/null; } &&
    echo "setup: installed safetensors and numpy from PyPI" ||
    echo "setup: could not install safetensors/numpy from PyPI; the st_check test will be skipped"
fi

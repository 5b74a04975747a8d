#!/usr/bin/env bash
# setup.sh - installs the Debian packages ZeroShard builds and tests with, only those missing.
# Run as root (or with sudo available). CUDA, NCCL and cuBLAS are optional and never installed here.
set -eu
pkgs="build-essential cmake pkg-config git openmpi-bin libopenmpi-dev libhwloc-dev liburing-dev libjansson-dev fio"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
  echo "setup: all packages present ($pkgs)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo > /dev/null || { echo "setup: need root to install:$missing" >&2; exit 1; }
  SUDO=sudo
fi
echo "setup: installing$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing

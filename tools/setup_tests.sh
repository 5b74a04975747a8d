#!/usr/bin/env bash
# setup_tests.sh - the test command's own set-up (tools/test.sh runs it; tools/setup.sh never does): PyTorch
# for the transformer's parity test (tests/gpt_parity.sh). PyPI's torch wheel brings ~4 GB of CUDA libraries
# that torch's import loads even on a CPU, so it stays out of the main job. Failing here only skips that
# test; ZS_TEST_TORCH=0 skips the install.
set -u
[ "${ZS_TEST_TORCH:-1}" != 0 ] || { echo "setup_tests: ZS_TEST_TORCH=0: torch not installed, gpt_parity will skip"; exit 0; }
command -v python3 > /dev/null || { echo "setup_tests: no python3: gpt_parity will skip"; exit 0; }
python3 -c 'import torch' 2> /dev/null && { echo "setup_tests: torch present"; exit 0; }
echo "setup_tests: installing torch from PyPI (~4 GB with its CUDA libraries, about 2 minutes)"
# Debian's Python refuses a plain pip install (PEP 668), hence the second form
{ python3 -m pip install -q torch 2> /dev/null || python3 -m pip install -q --break-system-packages torch; } &&
  python3 -c 'import torch' 2> /dev/null && echo "setup_tests: installed torch" ||
  echo "setup_tests: could not install torch; gpt_parity will skip"
exit 0

#!/usr/bin/env bash
# setup_tests.sh - the test command's own set-up (tools/test.sh runs it; tools/setup.sh never does): PyTorch
# for the transformer's parity test (tests/gpt_parity.sh) and the front end's (tests/torch_api.sh), and the
# pinned transformers and peft for the Hugging Face checks (tests/torch_hf.sh), the frameworks the adapters
# are tested against (lightning, accelerate: tests/fw_*) and scikit-build-core, which builds the package with
# its library (tests/pkg_install.sh), and DeepSpeed itself, the oracle the DeepSpeed-compatible package is compared
# with (tests/ds_compat.sh; its ops are not built: the tests use torch's optimizers). PyPI's torch wheel brings
# ~4 GB of CUDA libraries that torch's import loads even on a CPU, so it stays out of the main job. Failing
# here only skips those tests; ZS_TEST_TORCH=0 skips every install, ZS_TEST_HF=0 the pinned packages.
set -u
HF_PINS="transformers==5.24.0 peft==0.21.2 accelerate==1.15.0 lightning==2.6.6 scikit-build-core==1.1.2 deepspeed==0.19.8"

pip_install() {   # Debian's Python refuses a plain pip install (PEP 668), hence the second form
  python3 -m pip install -q "$@" 2> /dev/null || python3 -m pip install -q --break-system-packages "$@"
}

[ "${ZS_TEST_TORCH:-1}" != 0 ] || { echo "setup_tests: ZS_TEST_TORCH=0: nothing installed, the torch tests will skip"; exit 0; }
command -v python3 > /dev/null || { echo "setup_tests: no python3: the torch tests will skip"; exit 0; }
if python3 -c 'import torch' 2> /dev/null; then
  echo "setup_tests: torch present"
else
  echo "setup_tests: installing torch from PyPI (~4 GB with its CUDA libraries, about 2 minutes)"
  pip_install torch && python3 -c 'import torch' 2> /dev/null && echo "setup_tests: installed torch" ||
    { echo "setup_tests: could not install torch; gpt_parity, torch_api_* and torch_hf_* will skip"; exit 0; }
fi

[ "${ZS_TEST_HF:-1}" != 0 ] || { echo "setup_tests: ZS_TEST_HF=0: transformers and peft not installed, torch_hf_* will skip"; exit 0; }
have=$(python3 -c '
import sys
from importlib.metadata import version
names = [p.split("==")[0] for p in sys.argv[1:]]
print(" ".join(n + "==" + version(n) for n in names))' $HF_PINS 2> /dev/null)
if [ "$have" = "$HF_PINS" ]; then
  echo "setup_tests: $HF_PINS present"
  exit 0
fi
# pinned: the checks' tolerances were measured with these versions (torch stays as installed)
echo "setup_tests: installing $HF_PINS (${have:-not installed})"
pip_install $HF_PINS && python3 -c 'import transformers, peft, accelerate, lightning, deepspeed' 2> /dev/null &&
  echo "setup_tests: installed $HF_PINS" || echo "setup_tests: could not install $HF_PINS; torch_hf_* and fw_* will skip"
exit 0

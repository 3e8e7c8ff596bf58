#!/usr/bin/env bash
# Installs the model bench's DIN peer, DeepCTR-Torch on the CPU, into .tools/deepctr (pinned
# versions). Opt-in and large: PyPI's torch wheel depends on CUDA's wheels (about 8.5 GB in
# all), which torch needs to import even on a machine without a GPU. deepctr-torch imports
# requests (its version check) without declaring it. scripts/test.sh never
# runs this; benches/peer/deepctr_din.py runs in it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.tools/deepctr"

python3 -m venv "$venv"
"$venv/bin/pip" install --quiet \
    torch==2.14.1 deepctr-torch==0.3.0 numpy==2.4.6 scikit-learn==1.9.1 pyarrow==26.0.1 \
    tqdm==4.70.1 requests==2.34.2
"$venv/bin/python" -c 'import torch, deepctr_torch; print("DeepCTR-Torch", deepctr_torch.__version__, "on torch", torch.__version__, "in", "'"$venv"'")'

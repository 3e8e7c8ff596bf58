#!/usr/bin/env bash
# Installs the train bench's peer, TorchRec on the CPU, into .tools/torchrec (pinned
# versions). Opt-in and large: PyPI's torch wheel depends on CUDA's wheels (about 8.5 GB in
# all), which torch needs to import even on a machine without a GPU. scripts/test.sh never
# runs this; `cargo bench -p primus-benches --bench train` uses the peer once it is here.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.tools/torchrec"

python3 -m venv "$venv"
"$venv/bin/pip" install --quiet \
    torch==2.14.1 torchrec==1.9.2 numpy==2.4.6 \
    tensordict==0.15.3 torchmetrics==1.0.3 pyre-extensions==0.0.32 tqdm==4.70.1
# torchrec depends on fbgemm-gpu, whose CUDA build fails to load without a GPU driver; the
# CPU build of the same version replaces it.
"$venv/bin/pip" uninstall --quiet --yes fbgemm-gpu fbgemm-gpu-cpu
"$venv/bin/pip" install --quiet --no-deps fbgemm-gpu-cpu==1.9.0
"$venv/bin/python" -c 'import torch, torchrec, fbgemm_gpu; print("TorchRec", torchrec.__version__, "on torch", torch.__version__, "in", "'"$venv"'")'

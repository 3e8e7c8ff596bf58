#!/usr/bin/env bash
# Installs what the Kubernetes, docker-compose and tracing tests run, each at a pinned
# version, into $CLUSTER_TOOLS_DIR (default ~/.cache/primus-rs/tools, outside the clone like
# the cargo target dir, so a fresh clone on the same machine finds them). A second run finds
# everything and does nothing.
#
# From the Go module proxy, built here (GOMODCACHE and GOCACHE under ~/.cache/primus-rs/go):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl
#   (kustomize inside) v1.34.4 and etcd v3.6.4   one `go build` over scripts/go-tools/kubernetes
#   CoreDNS v1.15.0                               the cluster DNS
#   MinIO (pinned pseudo-version)                 S3 for the cluster and compose (AGPL: run as its own program)
#   Jaeger v1.76.0 (Jaeger v2, cmd/jaeger)        OTLP receiver and query API
#   Docker Compose v2.40.3                        `docker-compose` for deploy/docker-compose.yaml
#   Kueue v0.17.0 (cmd/kueue, and its CRDs)       the queue that admits suspended Jobs
# From Debian: containerd, runc, the CNI plugins, iptables, docker.io (dockerd), debootstrap.
# And a Debian bookworm root file system (debootstrap minbase, with tini, ca-certificates,
# curl, wget and redis-server), with its tar as the base layer of every image the tests build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/env.sh
. "$ROOT/scripts/env.sh"
CACHE="$CLUSTER_TOOLS_DIR"
GO_CACHE="${GO_TOOLS_CACHE:-$HOME/.cache/primus-rs/go}"
export GOMODCACHE="$GO_CACHE/mod" GOCACHE="$GO_CACHE/build" GOFLAGS=-modcacherw GOTOOLCHAIN=local
export CGO_ENABLED=0

KUBERNETES_VERSION="v1.34.4"
ETCD_VERSION="v3.6.4" # must equal the require line of scripts/go-tools/kubernetes/go.mod
COREDNS_VERSION="v1.15.0"
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"
JAEGER_VERSION="v1.76.0"
COMPOSE_VERSION="v2.40.3"
KUEUE_VERSION="v0.17.0"
DEBIAN_SUITE="bookworm"
ROOTFS_PACKAGES="tini,ca-certificates,curl,wget,redis-server"

log() { printf '[install-cluster-tools] %s\n' "$*"; }
need_sudo() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
mkdir -p "$CACHE/bin"

# link NAME TARGET: $CACHE/bin/NAME points at the built binary (scripts/env.sh puts $CACHE/bin on PATH).
link() { ln -sfn "$2" "$CACHE/bin/$1"; }

# go_build_copy MODULE@VERSION PACKAGE OUT: `go build` inside a copy of the downloaded module,
# for modules whose go.mod has replace or exclude lines (`go install` refuses those).
go_build_copy() {
  local module="$1" package="$2" out="$3" src work
  src="$(go mod download -json "$module" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  work="$(mktemp -d)"
  cp -r "$src/." "$work/"
  chmod -R u+w "$work"
  (cd "$work" && go build -trimpath -ldflags "-s -w" -o "$out" "$package")
  rm -rf "$work"
}

packages=()
for pair in containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins \
  iptables:iptables dockerd:docker.io debootstrap:debootstrap nsenter:util-linux; do
  tool="${pair%%:*}" package="${pair#*:}"
  if [ "${tool#/}" != "$tool" ]; then [ -x "$tool" ] || packages+=("$package")
  else command -v "$tool" >/dev/null 2>&1 || packages+=("$package"); fi
done
if [ "${#packages[@]}" -gt 0 ]; then
  log "installing ${packages[*]} (Debian)"
  need_sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  need_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
  # The packages start system-wide daemons where an init system runs; the tests start their own.
  need_sudo systemctl disable --now docker containerd >/dev/null 2>&1 || true
fi

KUBE_DIR="$CACHE/kubernetes-$KUBERNETES_VERSION"
KUBE_BINARIES="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"
if [ ! -x "$KUBE_DIR/kubectl" ] || [ ! -x "$KUBE_DIR/etcd" ]; then
  log "building Kubernetes $KUBERNETES_VERSION and etcd $ETCD_VERSION (Go module proxy; minutes when nothing is cached)"
  minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
  rm -rf "$KUBE_DIR.part" && mkdir -p "$KUBE_DIR.part"
  (cd "$ROOT/scripts/go-tools/kubernetes" && go build -trimpath -tags selinux,notest,grpcnotrace \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
    -o "$KUBE_DIR.part/" \
    $(for b in $KUBE_BINARIES; do printf 'k8s.io/kubernetes/cmd/%s ' "$b"; done) go.etcd.io/etcd/server/v3)
  # A main package whose path ends in a major version is named after the element before it.
  mv "$KUBE_DIR.part/server" "$KUBE_DIR.part/etcd"
  rm -rf "$KUBE_DIR" && mv "$KUBE_DIR.part" "$KUBE_DIR"
fi
for b in $KUBE_BINARIES etcd; do link "$b" "$KUBE_DIR/$b"; done

COREDNS_DIR="$CACHE/coredns-$COREDNS_VERSION"
if [ ! -x "$COREDNS_DIR/coredns" ]; then
  log "building CoreDNS $COREDNS_VERSION (Go module proxy)"
  GOBIN="$COREDNS_DIR" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
fi
link coredns "$COREDNS_DIR/coredns"

MINIO_DIR="$CACHE/minio-$MINIO_VERSION"
if [ ! -x "$MINIO_DIR/minio" ]; then
  log "building MinIO $MINIO_VERSION (Go module proxy)"
  GOBIN="$MINIO_DIR" go install -trimpath -ldflags "-s -w" "github.com/minio/minio@$MINIO_VERSION"
fi
link minio "$MINIO_DIR/minio"

JAEGER_DIR="$CACHE/jaeger-$JAEGER_VERSION"
if [ ! -x "$JAEGER_DIR/jaeger" ]; then
  log "building Jaeger $JAEGER_VERSION (Go module proxy)"
  go_build_copy "github.com/jaegertracing/jaeger@$JAEGER_VERSION" ./cmd/jaeger "$JAEGER_DIR/jaeger"
fi
link jaeger "$JAEGER_DIR/jaeger"

COMPOSE_DIR="$CACHE/compose-$COMPOSE_VERSION"
if [ ! -x "$COMPOSE_DIR/docker-compose" ]; then
  log "building Docker Compose $COMPOSE_VERSION (Go module proxy)"
  go_build_copy "github.com/docker/compose/v2@$COMPOSE_VERSION" ./cmd "$COMPOSE_DIR/docker-compose"
fi
link docker-compose-v2 "$COMPOSE_DIR/docker-compose"

KUEUE_DIR="$CACHE/kueue-$KUEUE_VERSION"
if [ ! -x "$KUEUE_DIR/kueue" ] || [ ! -d "$KUEUE_DIR/crds" ]; then
  log "building Kueue $KUEUE_VERSION (Go module proxy)"
  GOBIN="$KUEUE_DIR" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  kueue_src="$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  rm -rf "$KUEUE_DIR/crds.part" && mkdir -p "$KUEUE_DIR/crds.part"
  cp "$kueue_src"/config/components/crd/bases/*.yaml "$KUEUE_DIR/crds.part/"
  mv "$KUEUE_DIR/crds.part" "$KUEUE_DIR/crds"
fi
link kueue "$KUEUE_DIR/kueue"
ln -sfn "$KUEUE_DIR/crds" "$CACHE/kueue-crds"

ROOTFS_ID="$DEBIAN_SUITE-$(printf '%s' "$ROOTFS_PACKAGES" | sha256sum | cut -c1-12)"
ROOTFS="$CACHE/rootfs-$ROOTFS_ID"
if [ ! -s "$ROOTFS.tar" ]; then
  log "making the Debian $DEBIAN_SUITE root file system with $ROOTFS_PACKAGES (debootstrap)"
  rm -rf "$ROOTFS.part"
  mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)"
  debootstrap --variant=minbase --include="$ROOTFS_PACKAGES" "$DEBIAN_SUITE" "$ROOTFS.part" \
    "${mirror:-http://deb.debian.org/debian}" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
  chroot "$ROOTFS.part" apt-get clean
  rm -rf "$ROOTFS.part"/var/lib/apt/lists/* "$ROOTFS.part"/usr/share/doc/* "$ROOTFS.part"/usr/share/man/* \
    "$ROOTFS.part"/usr/share/locale/* "$ROOTFS.part"/var/cache/apt/* "$ROOTFS.part"/var/log/*.log
  # The image layer: device nodes, /proc and /sys come from the container runtime.
  tar -C "$ROOTFS.part" --numeric-owner --sort=name --mtime=@0 \
    --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -cf "$ROOTFS.tar.part" .
  rm -rf "$ROOTFS.part" && mv "$ROOTFS.tar.part" "$ROOTFS.tar"
fi
ln -sfn "$ROOTFS.tar" "$CACHE/base-layer.tar"

log "kubernetes: $("$CACHE/bin/kubectl" version --client 2>/dev/null | head -1), etcd $("$CACHE/bin/etcd" --version | head -1 | awk '{print $3}')"
log "coredns:    $("$CACHE/bin/coredns" -version | head -1)"
log "minio:      $MINIO_VERSION ($CACHE/bin/minio)"
log "jaeger:     $JAEGER_VERSION (Jaeger v2, $CACHE/bin/jaeger)"
log "compose:    $COMPOSE_VERSION ($CACHE/bin/docker-compose-v2)"
log "kueue:      $KUEUE_VERSION ($CACHE/bin/kueue, its CRDs in $CACHE/kueue-crds)"
log "containerd: $(containerd --version | awk '{print $3}'), runc $(runc --version | head -1 | awk '{print $3}'), dockerd $(dockerd --version | awk '{print $3}' | tr -d ,)"
log "base layer: $(readlink -f "$CACHE/base-layer.tar") ($(du -mL "$CACHE/base-layer.tar" | cut -f1) MiB)"

#!/usr/bin/env bash
# Validates the deployment files: the compose file with Docker Compose v2, and each
# Kubernetes overlay rendered by `kubectl kustomize` against the Kubernetes schemas
# (kubernetes-validate --strict: unknown fields fail). That every setting they give a
# service exists is a cargo test (tests/deploy).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/env.sh
. scripts/env.sh

for tool in docker-compose-v2 kubernetes-validate; do
  command -v "$tool" >/dev/null 2>&1 || { echo "[check-deploy] $tool is missing: run scripts/install-deps.sh" >&2; exit 1; }
done
if ! command -v kubectl >/dev/null 2>&1; then
  echo "[check-deploy] kubectl is missing: the k8s overlays cannot be rendered. It is part of this machine image (kubectl with kustomize v5); install it from https://kubernetes.io/docs/tasks/tools/ and run again." >&2
  exit 1
fi

echo "[check-deploy] docker compose config: deploy/docker-compose.yaml"
docker-compose-v2 -f deploy/docker-compose.yaml config --quiet

rendered="$(mktemp -d)"
trap 'rm -rf "$rendered"' EXIT
for overlay in k8s/overlays/*/ k8s/example/ k8s/example-operator/; do
  name="$(basename "$overlay")"
  echo "[check-deploy] kubectl kustomize $overlay | kubernetes-validate --strict"
  kubectl kustomize "$overlay" > "$rendered/$name.yaml"
  kubernetes-validate --strict --quiet "$rendered/$name.yaml"
done
echo "[check-deploy] ok"

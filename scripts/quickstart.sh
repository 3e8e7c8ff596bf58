#!/usr/bin/env bash
# From a fresh machine to a running local Primus cluster: installs what is missing, builds,
# starts NATS, Redis and the six services (`primus up`), shows they are healthy, stops them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

./scripts/install-deps.sh
# shellcheck source=scripts/env.sh
. scripts/env.sh

echo "[quickstart] building (first build takes several minutes)"
cargo build --workspace --bins --locked
BIN="$CARGO_TARGET_DIR/debug"

echo "[quickstart] primus up --check"
"$BIN/primus" up --check --data-dir "$ROOT/.primus" \
  --nats-port "${PRIMUS_QUICKSTART_NATS_PORT:-4222}" \
  --redis-port "${PRIMUS_QUICKSTART_REDIS_PORT:-6379}"
echo "[quickstart] done: every service started, reported SERVING and stopped with exit 0"

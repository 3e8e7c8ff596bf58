#!/usr/bin/env bash
# Everything CI checks: installs what is missing, then formatting, clippy and every test.
# Tests start their own NATS, Redis and SeaweedFS on loopback (primus-testkit); with CI=true
# a server that cannot start fails the test that needs it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

./scripts/install-deps.sh
# shellcheck source=scripts/env.sh
. scripts/env.sh
echo "[test] CARGO_TARGET_DIR=$CARGO_TARGET_DIR"

./scripts/check-deploy.sh

echo "[test] cargo fmt --check"
cargo fmt --all --check
# --all-features: the optional `hdfs` support of primus-storage is built, linted and tested too.
echo "[test] cargo clippy -D warnings"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
echo "[test] cargo test"
cargo test --workspace --all-features --locked
